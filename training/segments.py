"""Sentence segments of packed training rows: the state resets at every sentence start.

A training row (``data.BpttBatcher``) is a stream of sentences cut into windows of ``unroll``
steps. In the default regime every sentence is read from a zero LSTM state, as everything
downstream runs it (``elmo embed``, ``elmo serve``, ``elmo perplexity``): a window's row splits
at its sentence starts into segments, each run from a zero state except a first segment that
continues the sentence the previous window cut (that one takes the row's carried state). The
segments of all rows run as one packed batch (``elmo_core.lstm.Packing``), so the recurrence
does exactly the work of the real tokens, in at most ``unroll`` sequential steps.

Both directions share the segments: a sentence's forward inputs ``<S> w1 .. wn`` and backward
inputs ``</S> wn .. w1`` have the same length and sit at the same positions of their rows.

``StepPlan``: what a training step needs to know about its batch (which positions are real tokens,
where the sentences start, which tokens are distinct, how wide they are), found in the host's batch
and copied without a host wait: read on the device, it would make the host wait for the device
several times a step; the step only queues device work.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from elmo_core import LstmState
from elmo_core.bilm import unique_rows
from elmo_core.char_encoder import CharEncoder
from elmo_core.host_to_device import to_device
from elmo_core.lstm import Packing

from .data import Batch


@dataclass
class Segments:
    """Shape: row (S,) batch row of each segment, reset (S,) bool (starts from a zero state),
    source (N,) each packed position's index in the flat (B*T) axis, unpack (B*T,) each flat
    position's packed index (N: padding, a zero row), last (B,) each row's last segment (-1: none)."""

    packing: Packing
    row: torch.Tensor
    reset: torch.Tensor
    source: torch.Tensor
    unpack: torch.Tensor
    last: torch.Tensor

    @classmethod
    def of(cls, starts: torch.Tensor, mask: torch.Tensor) -> "Segments":
        """starts (B, T) bool: a sentence's first input; mask (B, T) bool, each row a prefix."""
        B, T = mask.shape
        dev = mask.device
        lengths = mask.sum(1)  # (B,)
        cut = (starts & mask).clone()  # (B, T) where a segment begins
        cut[:, 0] |= lengths > 0
        b, t = torch.nonzero(cut, as_tuple=True)  # (S,) row-major: segments in row order
        same_row = torch.cat([b[1:] == b[:-1], torch.zeros(1, dtype=torch.bool, device=dev)])  # (S,)
        nxt = torch.cat([t[1:], t.new_zeros(1)])  # (S,) the next segment's start (in the same row)
        end = torch.where(same_row, nxt, lengths[b])  # (S,)
        packing = Packing(end - t, T)
        flat = packing.sources[0]  # (N,) in the (S*T) layout of segments
        source = (b * T + t)[flat // T] + flat % T  # (N,) in the (B*T) layout of rows
        unpack = torch.full((B * T,), source.numel(), dtype=torch.long, device=dev)
        unpack[source] = torch.arange(source.numel(), device=dev)
        last = torch.full((B,), -1, dtype=torch.long, device=dev)
        last[b] = torch.arange(b.numel(), device=dev)  # row-major order: the row's last segment wins
        return cls(packing, b, starts[b, t], source, unpack, last)

    def to(self, device: torch.device) -> "Segments":
        """These segments (made on the host, where building them reads the data) on ``device``,
        copied without a host wait."""
        moved = {k: to_device(v, device) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return Segments(self.packing.to(device), **moved)

    def initial(self, carried: LstmState) -> LstmState:
        """Each segment's initial state: zero at a sentence start, else its row's carried state.

        Shape: carried h (L, 2, B, P), c (L, 2, B, C) -> (L, 2, S, P), (L, 2, S, C)."""
        keep = (~self.reset).to(carried.h.dtype)[None, None, :, None]  # (1, 1, S, 1)
        return LstmState(carried.h[:, :, self.row] * keep, carried.c[:, :, self.row] * keep)

    def final(self, carried: LstmState, seg_final: LstmState) -> LstmState:
        """Each row's state after the window: its last segment's (a row without one keeps its own)."""
        has = (self.last >= 0)[None, None, :, None]  # (1, 1, B, 1)
        idx = self.last.clamp(min=0)
        return LstmState(torch.where(has, seg_final.h[:, :, idx], carried.h),  # (L, 2, B, P)
                         torch.where(has, seg_final.c[:, :, idx], carried.c))  # (L, 2, B, C)


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
