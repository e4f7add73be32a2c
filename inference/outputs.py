"""Turning the biLM's L+1 layers into what the user asked for: all, top, average or mixed; then
pooled (mean / max) or unit length, in the output dtype.

``elmo_core.vectors.VectorRequest`` is the one description of that; ``reduce_on_device`` and
``finish_on_device`` apply it to a batch on the backend's device (torch tensors, CPU or CUDA) before anything is
copied out. ``reduce_layers`` and ``unit_length`` (numpy) are the references they are tested
against, and what the stateful path uses.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from elmo_core.kinds import OutputMode
from elmo_core.vectors import VectorRequest, check_output

if TYPE_CHECKING:  # a request is made (and checked) without the model code; applied with it
    import torch


def reduce_on_device(layers: torch.Tensor, mask: torch.Tensor, request: VectorRequest) -> torch.Tensor:
    """The output modes that are not a fixed weighting: all layers (token-major) or the
    layer-normalised mix (``reduce_layers``'s; the other modes ignore ``layer_norm`` there too).
    Shape: layers (B, L+1, T, D) float32, mask (B, T) bool -> (B, T, [L+1,] D)."""
    from elmo_core.scalar_mix import ScalarMix

    if request.mode.layer_axis:
        return layers.transpose(1, 2)  # (B, T, L+1, D)
    mix = ScalarMix(layers.shape[1], request.mix, request.gamma, do_layer_norm=True).to(layers.device)
    return mix(layers, mask) * mask[:, :, None]  # (B, T, D); bool mask promotes to float


def finish_on_device(x: torch.Tensor, request: VectorRequest, keep: torch.Tensor | None = None,
                     take: torch.Tensor | None = None) -> torch.Tensor:
    """Pool or normalise a batch's vectors where they are, before the copy.

    Without ``pool``: the tokens ``take`` names (flat positions b*T+t, in the order they are
    wanted; None: all), each to unit length if asked, then in the request's dtype: only those
    cross to the host. With ``pool``: ``keep`` marks the tokens that belong to the batch's rows (a
    window keeps only its middle part); the result is each row's partial: the sum (mean) or the
    largest value (max) of its kept tokens, in float32, for ``finish_pooled`` to join a
    sentence's windows.

    Shape: x (B, T, [L+1,] D), keep (B, T) bool, take (n,) -> (n, [L+1,] D) ((B, T, [L+1,] D)
    without ``take``), or (B, [L+1,] D) pooled; x may be the tokens already taken (n, [L+1,] D), no
    ``take`` then (``BiLM.run_combined``'s).
    """
    import torch

    if request.pool is None and take is not None:
        x = x.reshape(-1, *x.shape[2:])  # (B*T, [L+1,] D)
        if not request.normalize and 5 * take.numel() >= 3 * x.shape[0]:  # most rows are taken
            return x.float().to(request.vector_dtype.torch).index_select(0, take)  # a cast commutes with a gather
        x = x.index_select(0, take)  # (n, [L+1,] D)
    x = x.float()
    if request.pool is not None:
        k = keep.reshape(keep.shape + (1,) * (x.dim() - 2))  # (B, T, 1, ...)
        if request.pool == "mean":
            return torch.where(k, x, 0).sum(dim=1)  # (B, [L+1,] D)
        return torch.where(k, x, float("-inf")).amax(dim=1)
    if request.normalize:
        x = unit_norm(x)
    return x.to(request.vector_dtype.torch)


def unit_norm(x: torch.Tensor) -> torch.Tensor:
    """Each vector over the last axis to unit L2 norm, at any scale float32 holds: divided by its
    largest |value| first, so its squares neither overflow (a vector of 1e20s, a large ``gamma``)
    nor all vanish (1e-30s); a zero vector stays zero, a non-finite one gives NaN (found after).
    Shape: (..., D) float32 -> (..., D)."""
    import torch

    peak = x.abs().amax(dim=-1, keepdim=True)  # (..., 1)
    x = x / torch.where(peak > 0, peak, 1.0)  # within [-1, 1]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (..., 1), at least 1 where peak > 0
    return x / torch.where(norm > 0, norm, 1.0)


def finish_pooled(partials: np.ndarray, lengths: np.ndarray, request: VectorRequest) -> np.ndarray:
    """Each sentence's windows' partials (already joined: summed for mean, maxed for max) made
    its pooled vector: divided by its token count for mean, unit length if asked, in the dtype.
    Shape: partials (R, [L+1,] D) float64, lengths (R,) (<= 0: no token) -> (R, [L+1,] D), NaN rows
    where a sentence has no token."""
    n = np.maximum(lengths, 0)  # (R,)
    rows = partials / np.maximum(n, 1).reshape((-1,) + (1,) * (partials.ndim - 1)) if request.pool == "mean" else partials
    rows = np.where((n > 0).reshape((-1,) + (1,) * (partials.ndim - 1)), rows, np.nan)
    if request.normalize:
        rows[n > 0] = unit_length(rows[n > 0])
    return rows.astype(request.dtype)


def reduce_layers(layers: np.ndarray, mask: np.ndarray, output: str, mix_weights: Sequence[float] | None = None,
                  gamma: float = 1.0, layer_norm: bool = False) -> np.ndarray:
    """Apply an output mode to a batch.

    ``mix_weights`` are the scalar mix's unnormalised weights s (softmax is applied), as AllenNLP's
    and bilm-tf's trained ScalarMix parameters are; None means equal weights.

    Shape: layers (B, L+1, T, D), mask (B, T) -> (B, L+1, T, D) for 'all', else (B, T, D).
    """
    check_output(output, layers.shape[1], mix_weights)
    mode = OutputMode.of(output)
    if mode.layer_axis:
        return layers
    if mode.layer is not None:
        return layers[:, mode.layer]
    if not mode.mixes:  # the average
        return layers.mean(axis=1, dtype=np.float32) * mask[:, :, None]
    import torch

    from elmo_core.scalar_mix import ScalarMix

    mix = ScalarMix(layers.shape[1], mix_weights, gamma, do_layer_norm=layer_norm)
    with torch.inference_mode():
        mixed = mix(torch.from_numpy(layers), torch.from_numpy(mask))  # (B, T, D)
    return (mixed * torch.from_numpy(mask)[:, :, None]).numpy()


def combine_layers(layers: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum_j weights[j] * layers[:, j]`` (layers are zero at padding, so the result is too).

    Shape: layers (B, L+1, T, D), weights (L+1,) -> (B, T, D) float32.
    """
    out = layers[:, 0] * np.float32(weights[0])  # (B, T, D); a weighted sum ran 3x faster than einsum
    for j in range(1, layers.shape[1]):
        out += layers[:, j] * np.float32(weights[j])
    return out


def unit_length(vectors: np.ndarray) -> np.ndarray:
    """Each vector (the last axis) over its L2 norm, in float64 then back; a zero vector stays zero.
    Shape: (..., D) -> (..., D)."""
    v = vectors.astype(np.float64)
    norm = np.linalg.norm(v, axis=-1, keepdims=True)  # (..., 1)
    return (v / np.where(norm > 0, norm, 1.0)).astype(vectors.dtype)


# IEEE exponent bits all set: inf or NaN, whatever the mantissa (one integer pass, ~2x np.isfinite on float16)
_EXPONENT = {np.dtype(np.float16): (np.uint16, 0x7C00), np.dtype(np.float32): (np.uint32, 0x7F800000),
             np.dtype(np.float64): (np.uint64, 0x7FF0000000000000)}
# Rows are tested a slice of about this many bytes at a time, so the pass's two temporaries stay in
# the core's cache: 6-7 GB/s against 1.5 GB/s for one pass over a window (AMX Xeon, D = 1,024).
_CHECK_BYTES = 256 << 10


def non_finite_rows(values: np.ndarray) -> np.ndarray:
    """Which leading rows of ``values`` hold inf or NaN. Shape: (N, ...) -> (N,) bool."""
    flat = np.ascontiguousarray(values).reshape(len(values), int(np.prod(values.shape[1:])))
    uint, exponent = _EXPONENT[flat.dtype]
    bits, mark = flat.view(uint), uint(exponent)
    step = max(1, _CHECK_BYTES // max(1, flat.itemsize * flat.shape[1]))
    bad = np.empty(len(flat), dtype=bool)  # (N,)
    for start in range(0, len(flat), step):
        bad[start : start + step] = ((bits[start : start + step] & mark) == mark).any(axis=1)
    return bad


def first_non_finite(vectors: np.ndarray, lengths: np.ndarray, pooled: bool) -> int | None:
    """The first sentence whose vectors hold inf or NaN, None where all are finite (a pooled
    sentence without tokens is NaN by design: not counted). Shape: vectors (N tokens or R pooled,
    [L+1,] D), the sentences' tokens one after another; lengths (R,) (<= 0: no token)."""
    bad = non_finite_rows(vectors)  # (N,) tokens or (R,) sentences
    if pooled:
        bad &= lengths > 0
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    return first if pooled else int(np.searchsorted(np.cumsum(np.maximum(lengths, 0)), first, "right"))
