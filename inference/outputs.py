"""Turning the biLM's L+1 layers into what the user asked for: all, top, average or mixed."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from elmo_core import ScalarMix
from elmo_core.errors import InputError
from elmo_core.names import OUTPUT_MODES



def check_output(output: str, n_layers: int, mix_weights: Sequence[float] | None) -> None:
    if output not in OUTPUT_MODES:
        raise InputError(f"output must be one of {OUTPUT_MODES}, got {output!r}")
    if mix_weights is not None and len(mix_weights) != n_layers:
        raise InputError(f"mix weights: expected {n_layers} values (one per layer), got {len(mix_weights)}")


def reduce_layers(layers: np.ndarray, mask: np.ndarray, output: str, mix_weights: Sequence[float] | None = None,
                  gamma: float = 1.0, layer_norm: bool = False) -> np.ndarray:
    """Apply an output mode to a batch.

    ``mix_weights`` are the scalar mix's unnormalised weights s (softmax is applied), as AllenNLP's
    and bilm-tf's trained ScalarMix parameters are; None means equal weights.

    Shape: layers (B, L+1, T, D), mask (B, T) -> (B, L+1, T, D) for 'all', else (B, T, D).
    """
    check_output(output, layers.shape[1], mix_weights)
    if output == "all":
        return layers
    if output == "top":
        return layers[:, -1]
    if output == "average":
        return layers.mean(axis=1, dtype=np.float32) * mask[:, :, None]
    mix = ScalarMix(layers.shape[1], mix_weights, gamma, do_layer_norm=layer_norm)
    with torch.inference_mode():
        mixed = mix(torch.from_numpy(layers), torch.from_numpy(mask))  # (B, T, D)
    return (mixed * torch.from_numpy(mask)[:, :, None]).numpy()


def layer_weights(output: str, n_layers: int, mix_weights: Sequence[float] | None = None,
                  gamma: float = 1.0) -> np.ndarray | None:
    """The output mode as one weight per layer, where it is a linear combination of the layers:
    top (one-hot), average (1 / (L+1) each), mixed (``gamma * softmax(s)``, ScalarMix's own
    normalisation, in float64); None for all. ``reduce_layers`` is the reference these weights
    must match; the mixed ONNX export bakes the same weights in (``ExportSpec.normalized_mix``).

    Shape: -> (L+1,) float64, or None.
    """
    check_output(output, n_layers, mix_weights)
    if output == "all":
        return None
    if output == "top":
        return np.eye(n_layers)[-1]
    if output == "average":
        return np.full(n_layers, 1.0 / n_layers)
    mix = ScalarMix(n_layers, mix_weights, gamma)  # its parameters, normalised here in float64
    with torch.no_grad():
        return (mix.gamma.double() * torch.softmax(mix.scalars.double(), dim=0)).numpy()


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
