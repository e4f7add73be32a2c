"""Parity of an exported graph against the torch backend; failures raise ParityError."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from elmo_core.bilm import Tokenizer
from inference.backends import TorchBackend
from inference.outputs import reduce_layers

from formats.export_spec import ExportSpec, Tolerance

from .errors import ParityError

RunFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
_ALPHABET = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:'-!?") + ["é", "ü", "日本", "😀"]


def random_char_ids(batch: int, time: int, rng: np.random.Generator, tokenizer: Tokenizer) -> np.ndarray:
    """Left-aligned token ids (the model's tokenizer) of random tokens: row 0 fills ``time``, others
    are shorter or empty.

    Shape: -> (batch, time, W) int32.
    """
    ids = np.zeros((batch, time, tokenizer.width), np.int32)
    for row in range(batch):
        n = time if row == 0 else int(rng.integers(0, time + 1))
        # each token's size drawn, then its characters; 60: longer than a token's 48 bytes
        tokens = ["".join(rng.choice(_ALPHABET, int(rng.choice([1, 2, 3, 5, 8, 13, 60])))) for _ in range(n)]
        if tokens:
            ids[row, :n] = tokenizer.token_ids(tokens)
    return ids


def reference(torch_backend: TorchBackend, spec: ExportSpec, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the export must compute, from the torch backend. Shape: as the spec's outputs."""
    layers, mask = torch_backend.run(ids)
    if spec.mode.layer_axis:
        return layers, mask
    return reduce_layers(layers, mask, "mixed", spec.vectors.mix, spec.vectors.gamma), mask


def layer_cosines(out: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Cosine of each token's vectors per layer (the mix as one layer), 1.0 at padding and where both
    vectors are zero (equal: a mix with gamma 0), 0.0 where only one is.

    Shape: out, ref (B, [L+1,] T, D), mask (B, T) -> (L+1 or 1, B, T).
    """
    if out.ndim == 3:
        out, ref = out[:, None], ref[:, None]
    a, b = np.moveaxis(out, 1, 0).astype(np.float64), np.moveaxis(ref, 1, 0).astype(np.float64)  # (L+1, B, T, D)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)  # (L+1, B, T)
    cos = np.where((na == 0) & (nb == 0), 1.0, (a * b).sum(-1) / np.maximum(na * nb, 1e-30))
    return np.where(mask[None], cos, 1.0)


def worst_token(cos: np.ndarray) -> dict[str, int | float]:
    """Where the lowest cosine is: layer (0 = char-CNN, k = biLSTM layer k), row, time step. Shape: (L+1, B, T)."""
    layer, row, time = np.unravel_index(int(np.argmin(cos)), cos.shape)
    return {"layer": int(layer), "row": int(row), "time": int(time), "cosine": float(cos[layer, row, time])}


def compare(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> dict[str, object]:
    (out, mask), (ref, ref_mask) = got, want
    if out.shape != ref.shape or not np.array_equal(mask, ref_mask):
        raise ParityError(f"shape or mask differs: got {out.shape}, expected {ref.shape}")
    cos = layer_cosines(out, ref, ref_mask)
    return {"max_abs": float(np.abs(out.astype(np.float64) - ref).max(initial=0.0)),
            "min_cosine": float(cos.min(initial=1.0)), "worst": worst_token(cos) if cos.size else None}


def where(worst: dict | None, spec: ExportSpec) -> str:
    """A worst token's place in words: its layer and time step."""
    if worst is None:
        return "no token"
    layer = "the mix" if spec.mode.mixes else ("layer 0 (char-CNN)" if worst["layer"] == 0
                                                       else f"layer {worst['layer']} (biLSTM {worst['layer']})")
    return f"{layer}, time step {worst['time']}"


class ShapeSample:
    """Random ids of each (batch, time) of the spec's validation shapes (or ``shapes``), and the
    torch backend's outputs on them, computed once for every graph compared."""

    def __init__(self, torch_backend: TorchBackend, spec: ExportSpec,
                 shapes: Sequence[tuple[int, int]] | None = None, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.spec = spec
        self.ids = [(b, t, random_char_ids(b, t, rng, torch_backend.tokenizer))
                    for b, t in shapes or spec.validation_shapes]
        self.refs = [reference(torch_backend, spec, ids) for _, _, ids in self.ids]

    def rows(self, run: RunFn) -> list[dict[str, object]]:
        """Per shape: its batch and time, max |diff|, min token cosine and the worst token."""
        return [{"batch": b, "time": t, **compare(run(ids), ref)} for (b, t, ids), ref in zip(self.ids, self.refs)]

    def check(self, run: RunFn, tolerance: Tolerance | None = None, label: str = "ONNX Runtime") -> dict[str, object]:
        """``rows`` held to ``tolerance`` (default the spec's); ParityError naming the first shape beyond it.
        Returns the figures (per shape and worst case) that go into manifest.json."""
        tol, spec = tolerance or self.spec.tolerance, self.spec
        rows = self.rows(run)
        worst = {"max_abs": max(r["max_abs"] for r in rows), "min_cosine": min(r["min_cosine"] for r in rows)}
        failed = [r for r in rows if (tol.max_abs is not None and not r["max_abs"] <= tol.max_abs)
                  or (tol.min_cosine is not None and not r["min_cosine"] >= tol.min_cosine)]
        if failed:
            r = failed[0]
            raise ParityError(f"{label} differs from the torch backend beyond {tol.to_dict()} at batch {r['batch']}, "
                              f"time {r['time']}: max |diff| {r['max_abs']:.3g}, min token cosine "
                              f"{r['min_cosine']:.6f} at {where(r['worst'], spec)} of row "
                              f"{r['worst']['row'] if r['worst'] else '-'} ({len(failed)} of {len(rows)} shapes fail)")
        return {"against": "torch backend (fp32, CPU)", "tolerance": tol.to_dict(), "shapes": rows, **worst,
                "passed": True}


def check_parity(run: RunFn, torch_backend: TorchBackend, spec: ExportSpec,
                 shapes: Sequence[tuple[int, int]] | None = None, tolerance: Tolerance | None = None,
                 seed: int = 0, label: str = "ONNX Runtime") -> dict[str, object]:
    """Run ``run`` and the torch backend on random ids of each (batch, time); raise if out of tolerance
    (``ShapeSample.check``)."""
    return ShapeSample(torch_backend, spec, shapes, seed).check(run, tolerance, label)
