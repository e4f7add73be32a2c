"""The stacked bidirectional LSTM with projection, cell clipping and projection clipping.

Both directions run together as batched matrix products. Rows are sorted by length so that the
rows still running at step t are a prefix (the active set shrinks as sentences end); the backward
direction reads each sentence reversed within its own length, so it has the same active set.
Padded positions neither change the state nor emit output.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable

import torch
from torch import nn

from .config import LstmConfig
from .fused_sequence import fused_lstm_sequence
from .host_to_device import to_device
from .lstm_cell import low_bmm
from .lstm_sequence import lstm_sequence


# One layer of both directions over packed rows: (layer, xs, pack, h, c) -> (out, h, c).
RunLayer = Callable[[int, torch.Tensor, "Packing", torch.Tensor, torch.Tensor],
                    tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class LstmState:
    """Per-row recurrent state of every layer and direction.

    Shape: h (L, 2, B, P), c (L, 2, B, C); direction 0 forward, 1 backward.
    """

    h: torch.Tensor
    c: torch.Tensor

    def detach(self) -> "LstmState":
        return LstmState(self.h.detach(), self.c.detach())


def reverse_index(lengths: torch.Tensor, t_max: int) -> torch.Tensor:
    """Index that reverses each row within its length and leaves padding in place (self-inverse).

    Shape: lengths (B,) -> (T, B) long.
    """
    t = torch.arange(t_max, device=lengths.device)[:, None]  # (T, 1)
    rev = lengths[None, :] - 1 - t  # (T, B)
    return torch.where(t < lengths[None, :], rev, t)


class BiLstmStack(nn.Module):
    """L layers of forward and backward LSTMs with projection; residual connections above layer 0.

    Parameters are stored as the original stores them (TF orientation, gate order i, j, f, o); the
    +1 forget bias of the original is added at run time, so weight files round-trip bit-exactly.
    """

    # The training path's recurrence: one autograd function per layer (lstm_sequence.LstmSequence:
    # the maths of ``lstm_step``, a fused backward, batched weight gradients; under autocast its
    # products run in the autocast type and everything else in fp32). ``compile_cell`` swaps in the
    # same function with each step's element-wise work compiled into one kernel (fused_sequence).
    sequence: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = staticmethod(lstm_sequence)

    def __init__(self, cfg: LstmConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        L, P, C = cfg.n_layers, cfg.projection_dim, cfg.dim
        self.w_input = nn.Parameter(torch.empty(L, 2, P, 4 * C))  # (L, 2, P, 4C): W_0[:P]
        self.w_state = nn.Parameter(torch.empty(L, 2, P, 4 * C))  # (L, 2, P, 4C): W_0[P:]
        self.bias = nn.Parameter(torch.zeros(L, 2, 4 * C))  # (L, 2, 4C): B
        self.w_proj = nn.Parameter(torch.empty(L, 2, C, P))  # (L, 2, C, P): W_P_0
        self.dropout = dropout
        forget = torch.zeros(4 * C)
        forget[2 * C : 3 * C] = 1.0  # TF LSTMCell adds forget_bias=1.0 to gate f at run time
        self.register_buffer("forget_offset", forget, persistent=False)

    def zero_state(self, batch: int) -> LstmState:
        L, P, C = self.cfg.n_layers, self.cfg.projection_dim, self.cfg.dim
        w = self.w_input
        return LstmState(w.new_zeros(L, 2, batch, P), w.new_zeros(L, 2, batch, C))

    def compile_cell(self) -> None:
        """Training with fused, compiled steps (``elmo train --compile``):
        ``fused_sequence.FusedLstmSequence`` instead of ``LstmSequence``, the same gradients."""
        self.sequence = fused_lstm_sequence

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, state: LstmState | None = None,
                boundary_shortcut: bool = False, run_layer: RunLayer | None = None
                ) -> tuple[list[torch.Tensor], LstmState | None]:
        """Run every layer over length-masked rows (``run_layer``: see ``run_packed``).

        ``boundary_shortcut`` (stateless, rows framed by <S> ... </S>): each direction's first
        step sees the same boundary token from a zero state in every row, so it runs once and is
        shared; its last step (the other boundary) feeds nothing that is kept, so it is skipped.
        Outputs at that last position are then zero and no final state is returned.

        Shape: x (B, T, P) zero at padding, lengths (B,) -> L tensors (B, T, 2P), final state.
        """
        B, T, _ = x.shape
        shortcut = boundary_shortcut and state is None and B > 0 and bool((lengths >= 2).all())
        pack = Packing(lengths, T, shared_first=shortcut)
        outputs, final = self.run_packed(pack.pack(x), pack, state, run_layer)  # L x (2, N, P)
        layers = [pack.unpack(o) for o in outputs]  # [(B, T, 2P)]
        return layers, None if shortcut else final

    def forward_combined(self, x: torch.Tensor | TokenRows, lengths: torch.Tensor, weights: torch.Tensor,
                         positions: slice = slice(None), keep: torch.Tensor | None = None,
                         run_layer: RunLayer | None = None, take: torch.Tensor | None = None) -> torch.Tensor:
        """``sum_j weights[j] * layer_j`` of the stateless stack (rows framed by <S> ... </S>, as
        ``forward`` with ``boundary_shortcut``), layer 0 being ``[x; x]``. The layers are combined
        while packed (see ``combine_packed``) and unpacked once, instead of L+1 unpacks and a
        stack: how a scalar mix, top or average is computed for inference
        (``elmo_core.scalar_mix.ScalarMix`` over ``forward``'s layers is the reference).

        Shape: x (B, T, P) zero at padding (or its ``TokenRows``), lengths (B,) >= 2, weights (L+1,) -> (B, T', 2P) for
        ``positions`` (default all T), zero at padding, where ``keep`` (B, T') is False, and at each
        row's last position (the boundary the shortcut skips). ``take`` (n,): only the positions
        b*T'+t' it names, (n, 2P) (``unpack``).
        """
        pack = Packing(lengths, x.shape[1], shared_first=x.shape[0] > 0)
        combined = self.combine_packed(pack.pack(x, spare_row=True), pack, weights, run_layer)  # (2, N+1, P)
        return pack.unpack(combined, positions, keep, take)

    def combine_packed(self, xs: torch.Tensor, pack: "Packing", weights: torch.Tensor,
                       run_layer: RunLayer | None = None) -> torch.Tensor:
        """``sum_j weights[j] * layer_j`` over packed inputs (the packed input is layer 0 of both
        directions, each in its own reading order), plus one zero row for ``Packing.unpack``.
        Stateless. Nothing here waits on the device, so it can be captured in a CUDA graph.

        ``xs`` carries that zero row already (``Packing.pack(x, spare_row=True)``); with autograd
        off the mix is made in its place (``xs`` is overwritten), else in a new tensor.
        Shape: xs (2, N+1, P), weights (L+1,) -> (2, N+1, P).
        """
        N = xs.shape[1] - 1
        outputs, _ = self.run_packed(xs[:, :N], pack, None, run_layer)  # L x (2, N, P)
        combined = xs.clone() if torch.is_grad_enabled() else xs  # the last row stays zero
        combined[:, :N].mul_(weights[0])
        for j, out in enumerate(outputs, start=1):
            combined[:, :N].addcmul_(out, weights[j])
        return combined

    def run_packed(self, xs: torch.Tensor, pack: "Packing", state: LstmState | None = None,
                   run_layer: RunLayer | None = None) -> tuple[list[torch.Tensor], LstmState]:
        """Every layer over packed inputs of both directions (each read in its own order), each by
        ``run_layer`` (default ``self.run_layer``; inference passes a faster one that computes the
        same, ``inference.fast_lstm.FastLstm.run_layer``).

        Shape: xs (2, N, P) -> L outputs (2, N, P), final state (rows in the caller's order).
        """
        B = pack.shape[1]
        state = state if state is not None else self.zero_state(B)
        h0, c0 = state.h[:, :, pack.order], state.c[:, :, pack.order]  # (L, 2, B, P), (L, 2, B, C)
        outputs, h_fin, c_fin = [], [], []
        for layer in range(self.cfg.n_layers):
            if self.training and self.dropout > 0:
                xs = nn.functional.dropout(xs, self.dropout, training=True)
            out, h, c = (run_layer or self.run_layer)(layer, xs, pack, h0[layer], c0[layer])  # (2, N, P)
            if layer > 0 and self.cfg.use_skip_connections:  # residual: the layer's input is added to its output
                out = out.add_(xs) if not torch.is_grad_enabled() else out + xs
            outputs.append(out)
            h_fin.append(h)
            c_fin.append(c)
            xs = out
        return outputs, LstmState(torch.stack(h_fin)[:, :, pack.inverse], torch.stack(c_fin)[:, :, pack.inverse])

    def gate_bias(self, layer: int) -> torch.Tensor:
        """B plus TF's +1 forget bias. Shape: (2, 1, 4C)."""
        return (self.bias[layer] + self.forget_offset)[:, None, :]

    def run_layer(self, layer: int, xs: torch.Tensor, pack: "Packing", h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer of both directions over packed rows, from state (h, c): the reference, and
        the training path (autograd through ``sequence``).

        Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c (final, per row).
        """
        bias = self.gate_bias(layer)  # (2, 1, 4C)
        w_state, w_proj, w_input = self.w_state[layer], self.w_proj[layer], self.w_input[layer]
        dev = xs.device.type
        low = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        with torch.autocast(dev, enabled=False):  # under autocast: products in ``low``, the rest fp32
            gx = torch.baddbmm(bias, xs, w_input) if low is None else \
                torch.add(bias, low_bmm(xs.to(w_input.dtype), w_input.to(low)))  # (2, N, 4C): all steps' input part
            return self.sequence(gx, h, c, w_state, w_proj, pack.steps, pack.shared_first, *self.clips, low)

    @property
    def clips(self) -> tuple[float | None, float | None]:
        return self.cfg.cell_clip, self.cfg.proj_clip


@dataclass(frozen=True)
class TokenRows:
    """The LSTM's input as rows of a table: position (b, t) holds ``table[index[b, t]]`` (the
    inference fast path's form: one gather of the table makes the packed input, and nothing builds
    the (B, T, P) tensor). Shape: table (R, P), index (B, T) long -> (B, T, P)."""

    table: torch.Tensor
    index: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.index.shape, self.table.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def device(self) -> torch.device:
        return self.table.device

    def dense(self) -> torch.Tensor:
        """Shape: -> (B, T, P)."""
        return self.table.index_select(0, self.index.reshape(-1)).view(self.shape)


def dense(x: torch.Tensor | TokenRows) -> torch.Tensor:
    """The LSTM's input as one tensor. Shape: (B, T, P)."""
    return x.dense() if isinstance(x, TokenRows) else x


class Packing:
    """Rows sorted by length, time-major, real positions only (as torch's PackedSequence).

    Step t's active rows are the first n_t of the sorted batch and sit contiguously at
    [offset_t, offset_t + n_t) of the packed axis. Direction 1 reads each row reversed within
    its length, so both directions share the packing. With ``shared_first`` step 0 packs only
    row 0, and unpacking copies its output to every row. ``Packing.full(B, T)``: rows all T long.

    Packing and unpacking are one indexed gather each: ``sources`` (2, N) says where each packed
    position reads in the (B*T) axis, ``targets`` (2, B*T) which packed position each time step
    of each row comes from (N: none, a zero row). Both are built on first use: training runs
    ``Packing.full`` every step and never packs or unpacks.
    """

    def __init__(self, lengths: torch.Tensor, t_max: int, shared_first: bool = False) -> None:
        self.shared_first = shared_first
        self.order = torch.argsort(lengths, descending=True, stable=True)  # (B,)
        self.inverse = torch.argsort(self.order)  # (B,)
        sorted_lengths = lengths[self.order]
        self._rev = reverse_index(sorted_lengths, t_max)  # (T, B)
        steps = sorted_lengths - 1 if shared_first else sorted_lengths  # the last step is skipped
        real = torch.arange(t_max, device=lengths.device)[:, None] < steps[None, :]  # (T, B)
        if shared_first:
            real[0, 1:] = False
        self._index = torch.nonzero(real.reshape(-1)).squeeze(1)  # (N,) into the flat (T*B) axis
        counts = [n for n in real.sum(1).tolist() if n > 0]
        self.steps = list(zip(accumulate([0] + counts[:-1]), counts))  # (offset, active rows) per step
        self.shape = (t_max, lengths.shape[0])

    @functools.cached_property
    def sources(self) -> torch.Tensor:
        """Shape: (2, N): where each packed position reads in the (B*T) axis, per direction."""
        T, B = self.shape
        t, ranked = self._index // max(B, 1), self._index % max(B, 1)  # (N,) step and sorted row
        row = self.order[ranked] * T  # (N,)
        return torch.stack([row + t, row + self._rev[t, ranked]])  # forward, backward reading order

    @functools.cached_property
    def targets(self) -> torch.Tensor:
        """Shape: (2, B*T): the packed position each row's time step comes from (N: a zero row)."""
        T, B = self.shape
        N = self._index.numel()
        targets = torch.full((2, B * T), N, dtype=torch.long, device=self.order.device)
        for d in range(2):
            targets[d, self.sources[d]] = torch.arange(N, device=self.order.device)
        if self.shared_first and B > 1:  # step 0 ran once (packed position 0); every row reads it
            first = self.order * T  # (B,) each row's step 0, in sorted order
            targets[0, first] = 0
            targets[1, first + self._rev[0]] = 0
        return targets

    def to(self, device: torch.device) -> "Packing":
        """This packing (made on the host) on ``device``, copied without a host wait."""
        moved = copy.copy(self)
        moved.__dict__.update({k: to_device(v, device) for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)})
        return moved

    @classmethod
    def full(cls, batch: int, t_max: int, device: torch.device | None = None) -> "Packing":
        return cls(torch.full((batch,), t_max, dtype=torch.long, device=device), t_max)

    def pack(self, x: torch.Tensor | TokenRows, spare_row: bool = False) -> torch.Tensor:
        """Shape: (B, T, P) -> (2, N, P); ``TokenRows``: one gather of its table. ``spare_row``:
        (2, N+1, P), the last row zero (``unpack`` reads it for padding)."""
        N, P = self.sources.shape[1], x.shape[-1]
        rows = self.sources.view(-1)  # (2N,) into the flat (B*T) axis
        if isinstance(x, TokenRows):
            table, rows = x.table, x.index.reshape(-1).index_select(0, rows)
        else:
            table = x.reshape(-1, P)
        if not spare_row or torch.is_grad_enabled():
            packed = table.index_select(0, rows).view(2, N, P)
            return torch.cat([packed, packed.new_zeros(2, 1, P)], dim=1) if spare_row else packed
        out = table.new_empty(2, N + 1, P)
        out[:, N] = 0
        for d in range(2):
            torch.index_select(table, 0, rows[d * N : (d + 1) * N], out=out[d, :N])
        return out

    def unpack(self, packed: torch.Tensor, positions: slice = slice(None), keep: torch.Tensor | None = None,
               take: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: (2, N, P) -> (B, T', 2P) (or (n, 2P): ``take``), zero at padding, the backward half
        in reading order (see ``unpack``)."""
        return unpack(packed, self.targets, self.sources.shape[1], self.shape, positions, keep, take)


def unpack(packed: torch.Tensor, targets: torch.Tensor, n_packed: int, shape: tuple[int, int],
           positions: slice = slice(None), keep: torch.Tensor | None = None,
           take: torch.Tensor | None = None) -> torch.Tensor:
    """Packed outputs of both directions back to rows: ``targets`` says which of the ``n_packed``
    positions each row's time step comes from (``n_packed``: none, a zero row), per direction.

    ``positions``: the time steps wanted (default all T); ``keep`` (B, T') bool: the positions to
    fill, the others zero; ``take`` (n,) long: only the positions b*T'+t' it names, in its order,
    gathered straight from the packed rows (the (B, T') grid is never made: a job's tokens).
    ``packed`` may carry one more row, all zero (2, N+1, P); else one is added.
    Shape: packed (2, N[+1], P), targets (2, B*T), shape (T, B) -> (B, T', 2P), or (n, 2P) with ``take``.
    """
    T, B = shape
    N = n_packed
    if packed.shape[1] == N:
        packed = torch.cat([packed, packed.new_zeros(2, 1, packed.shape[-1])], dim=1)  # (2, N+1, P)
    targets = targets.view(2, B, T)[:, :, positions]  # (2, B, T')
    if keep is not None:
        targets = torch.where(keep, targets, N)
    if take is not None:
        targets = targets.reshape(2, -1).index_select(1, take)  # (2, n)
    index = torch.stack([targets[0], targets[1] + (N + 1)], dim=-1)  # (B, T', 2) or (n, 2) into both directions
    rows = packed.reshape(2 * (N + 1), -1).index_select(0, index.view(-1))  # (B*T'*2, P)
    return rows.view(*index.shape[:-1], 2 * packed.shape[-1])  # (B, T', 2P) or (n, 2P)
