"""A picture of one word's contexts: each panel a 2-D projection (PCA) of the word's vectors in
one layer, a dot per context coloured by its use (blue: noun, orange: verb). Written as a PNG by
hand (zlib + numpy), so the demo needs no plotting package."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from elmo_core.atomic import atomic_path

COLOURS = {"noun": (31, 119, 180), "verb": (255, 127, 14)}
PANEL, MARGIN, DOT = 360, 24, 3


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


def render(panels: Sequence[np.ndarray], uses: Sequence[str]) -> np.ndarray:
    """Panels side by side on white, each framed. Shape: each (K, 2) in [-1, 1] -> (H, W, 3) uint8."""
    h, w = PANEL + 2 * MARGIN, len(panels) * (PANEL + MARGIN) + MARGIN
    img = np.full((h, w, 3), 255, np.uint8)
    for p, xy in enumerate(panels):
        x0 = MARGIN + p * (PANEL + MARGIN)
        img[MARGIN, x0:x0 + PANEL] = img[MARGIN + PANEL - 1, x0:x0 + PANEL] = 160  # frame
        img[MARGIN:MARGIN + PANEL, x0] = img[MARGIN:MARGIN + PANEL, x0 + PANEL - 1] = 160
        inner = PANEL // 2 - 2 * DOT
        for (x, y), use in zip(xy, uses):
            cx, cy = x0 + PANEL // 2 + int(round(x * inner)), MARGIN + PANEL // 2 - int(round(y * inner))
            img[cy - DOT:cy + DOT + 1, cx - DOT:cx + DOT + 1] = COLOURS[use]
    return img


def png_bytes(img: np.ndarray) -> bytes:
    """An RGB image as PNG. Shape: (H, W, 3) uint8."""
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_picture(path: str | Path, panels: Sequence[np.ndarray], uses: Sequence[str]) -> Path:
    """Project each panel's vectors (K, D) to 2-D and write the PNG at ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(png_bytes(render([project_2d(v) for v in panels], uses)))
    return Path(path)
