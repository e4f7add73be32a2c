"""Turning the biLM's L+1 layers into what the user asked for: all, top, average or mixed."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from elmo_core import ScalarMix
from elmo_core.errors import InputError

OUTPUT_MODES = ("all", "top", "average", "mixed")


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
