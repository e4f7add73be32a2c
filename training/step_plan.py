"""What a training step needs to know about its batch's data, found on the host before the step.

On CUDA a step that reads its batch on the device (which positions are real tokens, where the
sentences start, which tokens are distinct, how wide they are) makes the host wait for the device
several times a step. The batch is host data first: ``StepPlan.of`` finds all of this there, and
``to(device)`` copies it without a host wait, so the step only queues device work.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from elmo_core.bilm import unique_rows
from elmo_core.char_encoder import CharEncoder
from elmo_core.host_to_device import to_device

from .data import Batch
from .segments import Segments


@dataclass
class TokenPlan:
    """The distinct tokens of both directions' real positions, for ``CharEncoder.forward_planned``.

    Shape: chars (U, W) distinct tokens in the encoder's chunk order, widths (chunks,) host ints,
    inverse (N2,) each real position's token, positions (N2,) the real positions in the flat (2*B*T) axis."""

    chars: torch.Tensor
    widths: list[int]
    inverse: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def of(cls, chars: torch.Tensor, mask: torch.Tensor, encoder: CharEncoder) -> "TokenPlan":
        """Shape: chars (2, B, T, W), mask (B, T) host tensors."""
        D, B, T, W = chars.shape
        positions = torch.nonzero(mask[None].expand(D, B, T).reshape(-1)).squeeze(1)  # (N2,)
        uniq, inverse = unique_rows(chars.reshape(-1, W)[positions])  # (U, W), (N2,)
        order, widths = encoder.plan_chunks(uniq)
        return cls(uniq[order], widths, torch.argsort(order)[inverse], positions)

    def to(self, device: torch.device) -> "TokenPlan":
        return TokenPlan(to_device(self.chars, device), self.widths, to_device(self.inverse, device),
                         to_device(self.positions, device))

    def embed(self, encoder: CharEncoder, shape: tuple[int, int, int]) -> torch.Tensor:
        """The tokens' representations, zero at padding. Shape: -> (2B, T, P) for shape (2B, T, P)."""
        emb = encoder.forward_planned(self.chars, self.widths)[self.inverse]  # (N2, P)
        flat = emb.new_zeros(shape[0] * shape[1], shape[2])
        return flat.index_copy(0, self.positions, emb).view(shape)


@dataclass
class StepPlan:
    """Shape: picked (N,) the real positions in the flat (B*T) axis; segments where the state resets
    (None: the state runs on); tokens (``TokenPlan``)."""

    picked: torch.Tensor
    segments: Segments | None
    tokens: TokenPlan

    @classmethod
    def of(cls, batch: Batch, encoder: CharEncoder, device: torch.device) -> "StepPlan":
        picked = torch.nonzero(batch.mask.reshape(-1)).squeeze(1)  # (N,)
        segments = None if batch.starts is None else Segments.of(batch.starts, batch.mask).to(device)
        return cls(to_device(picked, device), segments, TokenPlan.of(batch.chars, batch.mask, encoder).to(device))
