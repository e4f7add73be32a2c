"""A picture of one word's contexts: each panel a 2-D projection (PCA) of the word's vectors in one
layer, a dot per context coloured by its use (blue: noun, orange: verb), with a title naming the
word, a label per panel and a legend. Drawn with matplotlib, the optional ``plot`` extra
(``pip install 'elmo-pipeline[plot]'``); without it ``PictureUnavailable`` says how to get it."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from storage.atomic import atomic_path

from .errors import PictureUnavailable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {"noun": "#1f77b4", "verb": "#ff7f0e"}
PLOT_EXTRA = "pip install 'elmo-pipeline[plot]' (matplotlib)"


def can_draw() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def project_2d(vectors: np.ndarray) -> np.ndarray:
    """The first two principal components, scaled into [-1, 1]; identical vectors land on the
    centre. Shape: (K, D) -> (K, 2)."""
    centred = vectors.astype(np.float64) - vectors.mean(0, dtype=np.float64)  # (K, D)
    if not np.abs(centred).max(initial=0.0) > 1e-6 * max(float(np.abs(vectors).max(initial=0.0)), 1.0):
        return np.zeros((len(vectors), 2))
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ vt[:2].T  # (K, <=2)
    xy = np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))  # (K, 2)
    return xy / max(float(np.abs(xy).max()), 1e-12)


def draw(word: str, panels: Sequence[tuple[str, np.ndarray]], uses: Sequence[str]) -> "Figure":
    """One panel per (label, vectors (K, D)), side by side, each context a dot coloured by its use."""
    if not can_draw():
        raise PictureUnavailable(f"the picture needs matplotlib: {PLOT_EXTRA}")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(panels), 4.6), dpi=100, layout="constrained")
    fig.suptitle(f"'{word}' in {len(uses)} contexts: its uses as a noun and as a verb")
    labels = np.asarray(uses)
    for ax, (label, vectors) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        xy = project_2d(vectors)
        for use, colour in COLOURS.items():
            ax.scatter(*xy[labels == use].T, s=14, c=colour, alpha=0.7, label=f"{use} ({int((labels == use).sum())})")
        ax.set_title(label)
        ax.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), xticks=[], yticks=[], xlabel="1st principal component",
               ylabel="2nd principal component")
        ax.legend(loc="upper right", fontsize="small")
    return fig


def write_picture(path: str | Path, word: str, panels: Sequence[tuple[str, np.ndarray]], uses: Sequence[str]) -> Path:
    """``draw`` written as a PNG at ``path`` (atomically)."""
    fig = draw(word, panels, uses)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)
