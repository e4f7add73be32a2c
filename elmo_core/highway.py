"""Highway layers with the original (bilm-tf) gate convention."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch import nn


class Highway(nn.Module):
    """``y = g * relu(x W_t + b_t) + (1 - g) * x`` with carry gate ``g = sigmoid(x W_c + b_c)``.

    This is bilm-tf's convention: the gate multiplies the transform, ``1 - g`` carries the input
    (AllenNLP stores the negated carry weights to use the opposite one). ``weight`` holds the TF
    matrices side by side, ``[W_transform | W_carry]``, so the hdf5 load is a copy.

    Shape: (N, D) -> (N, D).
    """

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(n_layers, dim, 2 * dim))  # (K, D, 2D)
        self.bias = nn.Parameter(torch.zeros(n_layers, 2 * dim))  # (K, 2D)

    @property
    def n_layers(self) -> int:
        return self.weight.shape[0]

    def products(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
        """Each layer's ``x W + b``, plain torch. Shape: (N, D) -> (N, 2D)."""
        return tuple(functools.partial(affine, w, b) for w, b in zip(self.weight, self.bias))

    def forward(self, x: torch.Tensor, products: Sequence[Callable[[torch.Tensor], torch.Tensor]] | None = None) -> torch.Tensor:
        """``products``: each layer's ``x W + b`` (default ``products()``; a fast variant passes its own)."""
        for product in products or self.products():
            proj = product(x)  # (N, 2D)
            transform = torch.relu(proj[:, : self.dim])  # (N, D)
            gate = torch.sigmoid(proj[:, self.dim :])  # (N, D)
            x = x + gate * (transform - x)  # == g * transform + (1 - g) * x
        return x


def affine(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x W + b``, as TF stores W. Shape: x (N, K), weight (K, M), bias (M,) -> (N, M)."""
    return torch.addmm(bias, x, weight)
