"""Highway layers with the original (bilm-tf) gate convention."""
from __future__ import annotations

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in range(self.n_layers):
            proj = torch.addmm(self.bias[k], x, self.weight[k])  # (N, 2D)
            transform = torch.relu(proj[:, : self.dim])  # (N, D)
            gate = torch.sigmoid(proj[:, self.dim :])  # (N, D)
            x = x + gate * (transform - x)  # == g * transform + (1 - g) * x
        return x
