"""The scalar mix: ``gamma * sum_j softmax(s)_j * h_j`` over the biLM's L+1 layers."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from .errors import InputError


def _masked_layer_norm(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The original's normalisation: one mean and variance over all unmasked values of the batch.

    Shape: x (B, T, D), mask (B, T) -> (B, T, D).
    """
    m = mask[:, :, None].to(x.dtype)  # (B, T, 1)
    n = m.sum() * x.shape[-1]
    mean = (x * m).sum() / n
    var = (((x * m) - mean) * m).pow(2).sum() / n
    return (x - mean) / torch.sqrt(var + 1e-12)


class ScalarMix(nn.Module):
    """Softmax-normalised weights ``s`` and a scale ``gamma`` over the layers.

    ``do_layer_norm`` normalises each layer first as bilm-tf's ``weight_layers`` does; its
    statistics cover the whole batch, so with it a sentence's vector depends on its batch.

    Shape: layers (B, L+1, T, D), mask (B, T) -> (B, T, D).
    """

    def __init__(self, n_layers: int, weights: Sequence[float] | None = None, gamma: float = 1.0,
                 do_layer_norm: bool = False, trainable: bool = False) -> None:
        super().__init__()
        s = torch.zeros(n_layers) if weights is None else torch.tensor([float(w) for w in weights])
        if s.shape != (n_layers,):
            raise InputError(f"mix weights: expected {n_layers} values (one per layer), got {len(s)}")
        self.scalars = nn.Parameter(s, requires_grad=trainable)  # (L+1,) the unnormalised s
        self.gamma = nn.Parameter(torch.tensor(float(gamma)), requires_grad=trainable)
        self.do_layer_norm = do_layer_norm

    def normalized_weights(self) -> torch.Tensor:
        return torch.softmax(self.scalars, dim=0)  # (L+1,)

    def layer_weights(self) -> np.ndarray:
        """``gamma * softmax(s)`` in float64: the mix as one weight per layer (what the packed
        inference path and the mixed ONNX export multiply by). Shape: (L+1,)."""
        with torch.no_grad():
            return (self.gamma.double() * torch.softmax(self.scalars.double(), dim=0)).numpy()

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.do_layer_norm:
            layers = torch.stack([_masked_layer_norm(layers[:, j], mask) for j in range(layers.shape[1])], 1)
        w = self.normalized_weights().to(layers.dtype)  # (L+1,)
        mixed = (layers * w[None, :, None, None]).sum(dim=1)  # (B, T, D)
        return self.gamma.to(layers.dtype) * mixed
