"""Inference in one static shape: a batch's sentences laid end to end in R rows, run T steps at a time.

The sorted packing (``elmo_core.lstm.Packing``) changes shape with every batch and every step (the
active rows shrink), so a CUDA graph can only replay it per bucket of shapes, padded. Here every
batch runs one shape, ``RowShape(rows=R, steps=T)``:

- ``RowPlan``: the batch's sentences dealt to R rows, longest first to the shortest row, each
  sentence a contiguous span of its row; a row is read T positions at a time (a window), so a
  sentence may cross windows. Each direction reads the row in its own order: forward the
  sentences in order, backward each sentence reversed within its own span, so both directions
  share the spans and where the state is zeroed (a sentence's first position). Padding is only
  what is left at the rows' ends in the last window.
- ``RowLstm.window``: the stateless stack over one window, every layer and both directions, mixed
  (``BiLstmStack.combine_packed``'s maths); the state of every layer is carried to the next
  window and zeroed where a sentence starts. Each step is two products and two fused kernels
  (``elmo_core.fused_cell``: ``cell`` zeroes the cell state where a sentence starts, ``store``
  the next step's ``h``). Its shapes never change, so one CUDA graph replays it for every window
  of a job (``inference.cuda_graphs.RowGraphs``). The input part of the gates is one product a
  layer and window. On a CPU (``--layout rows``) the windows run eagerly and a step's two
  products run on packed oneDNN weights one direction at a time (``FusedLstm.packed_products``):
  every step multiplies all R rows, where the sorted packing's last steps run a few.

Equal per sentence to the reference (tests/inference/test_cuda_graphs.py: fp32 within 1e-6, bf16
cosine >= 0.999, every option).
"""
from __future__ import annotations

import copy
import heapq
import math

import torch

from elmo_core.host_to_device import to_device
from elmo_core.lstm import unpack

from .fast_lstm import input_parts
from .fused_lstm import FusedLstm
from .row_shape import RowShape


class RowPlan:
    """Where a batch's sentences sit in the rows (module doc).

    ``windows``: W; ``sources`` (2, W*T*R): each position's index in the batch's flat (B*T_in)
    axis per direction (B*T_in: padding, a zero row), windows then steps then rows; ``keep``
    (W*T+1, R) bool: False where a sentence starts (the state is zeroed before that step);
    ``targets`` (2, B*T_in): each token's position in the W*T*R axis (W*T*R: none).
    """

    def __init__(self, lengths: list[int], t_in: int, shape: RowShape, device: torch.device | str) -> None:
        R, T = shape.rows, shape.steps
        rows, offsets, fill = _deal(lengths, R)
        self.shape, self.windows = shape, max(1, math.ceil(max(fill) / T))
        n_pos = self.windows * T * R
        lens = torch.tensor(lengths, dtype=torch.long)
        b = torch.repeat_interleave(torch.arange(len(lengths)), lens)  # (N,) each token's sentence
        k = torch.arange(b.numel()) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)  # (N,) its index
        s = torch.tensor(offsets, dtype=torch.long)[b] + k  # (N,) its place in its row
        flat = (s // T) * (T * R) + (s % T) * R + torch.tensor(rows, dtype=torch.long)[b]  # (N,)
        fwd, bwd = b * t_in + k, b * t_in + lens[b] - 1 - k  # (N,) what each direction reads there
        sources = torch.full((2, n_pos), len(lengths) * t_in, dtype=torch.long)
        sources[0, flat], sources[1, flat] = fwd, bwd
        targets = torch.full((2, len(lengths) * t_in), n_pos, dtype=torch.long)
        targets[0, fwd], targets[1, bwd] = flat, flat
        keep = torch.ones(self.windows * T + 1, R, dtype=torch.bool)
        starts = lens > 0
        keep[torch.tensor(offsets, dtype=torch.long)[starts], torch.tensor(rows, dtype=torch.long)[starts]] = False
        self.sources, self.targets, self.keep = (to_device(t, device) for t in (sources, targets, keep))
        self.t_in, self.batch, self.tokens = t_in, len(lengths), int(lens.sum())

    def to(self, device: torch.device) -> "RowPlan":
        """This plan with its tensors on ``device`` (a plan made on the host: no host wait)."""
        moved = copy.copy(self)
        moved.sources, moved.targets, moved.keep = (to_device(t, device)
                                                    for t in (self.sources, self.targets, self.keep))
        return moved

    @property
    def padded_fraction(self) -> float:
        """Positions computed that hold no token, of all computed."""
        n_pos = self.windows * self.shape.steps * self.shape.rows
        return 1.0 - self.tokens / n_pos

    def window(self, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Window ``w``'s sources (2, T*R) and keep (T+1, R) (its steps and the next one's first)."""
        T, TR = self.shape.steps, self.shape.steps * self.shape.rows
        return self.sources[:, w * TR : (w + 1) * TR], self.keep[w * T : (w + 1) * T + 1]

    def unpack(self, combined: torch.Tensor, positions: slice = slice(None), keep: torch.Tensor | None = None,
               take: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: combined (2, W*T*R[+1], P) -> (B, T', 2P), or (n, 2P) (``elmo_core.lstm.unpack``)."""
        n_pos = self.windows * self.shape.steps * self.shape.rows
        return unpack(combined, self.targets, n_pos, (self.t_in, self.batch), positions, keep, take)


def _deal(lengths: list[int], rows: int) -> tuple[list[int], list[int], list[int]]:
    """Each sentence's row and offset, longest first to the least filled row; and each row's fill."""
    heap = [(0, r) for r in range(rows)]
    row_of, offset_of = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        filled, r = heapq.heappop(heap)
        row_of[i], offset_of[i] = r, filled
        heapq.heappush(heap, (filled + lengths[i], r))
    fill = [0] * rows
    for filled, r in heap:
        fill[r] = filled
    return row_of, offset_of, fill


ALIGN = 16  # bytes: inductor's CUDA kernels assume their inputs this aligned where the first they met were


def keep_buffer(shape: RowShape, device: torch.device | str) -> torch.Tensor:
    """A window's keep (T+1, R) bool, all True, each step's row at a multiple of ``ALIGN`` bytes
    (the row stride R rounded up): the kernels take ``keep[t]``, and a compiled CUDA kernel whose
    first input was aligned copies each later one that is not before it runs (at R = 8, a
    device-to-device copy every other step)."""
    stride = -(-shape.rows // ALIGN) * ALIGN
    return torch.ones(shape.steps + 1, stride, dtype=torch.bool, device=device)[:, : shape.rows]


class RowLstm:
    """The stateless stack over windows of one ``RowShape`` (module doc); the state of every layer
    lives here between windows (``reset`` zeroes it). Shapes: h (L, 2, R, P) in the products'
    type, c (L, 2, R, C) fp32."""

    def __init__(self, lstm: FusedLstm, shape: RowShape) -> None:
        self.lstm, self.shape = lstm, shape
        stack = lstm.stack
        L, P, C, R = stack.cfg.n_layers, stack.cfg.projection_dim, stack.cfg.dim, shape.rows
        device = stack.w_input.device
        self.h = torch.zeros(L, 2, R, P, dtype=lstm.dtype, device=device)
        self.c = torch.zeros(L, 2, R, C, device=device)
        self.clips = lstm.clips(device)

    def reset(self) -> None:
        self.h.zero_()
        self.c.zero_()

    def window(self, xs: torch.Tensor, keep: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[j] * layer_j`` over one window, layer 0 being the input. Nothing here
        waits on the device, so it can be captured in a CUDA graph.

        Shape: xs (2, T*R, P), keep (T+1, R) bool (``keep_buffer``: its steps' rows aligned), weights
        (L+1,) -> (2, T*R, P).
        """
        combined = xs * weights[0]  # (2, T*R, P)
        for layer in range(self.lstm.stack.cfg.n_layers):
            out = self._layer(layer, xs, keep)  # (2, T*R, P)
            if layer > 0 and self.lstm.stack.cfg.use_skip_connections:
                out.add_(xs)
            combined.addcmul_(out, weights[layer + 1])
            xs = out
        return combined

    def _layer(self, layer: int, xs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """One layer, both directions, T steps from the carried state. Shape: xs (2, T*R, P) -> (2, T*R, P)."""
        out = xs.new_empty(xs.shape[0], xs.shape[1], self.lstm.stack.cfg.projection_dim)  # (2, T*R, P)
        self.lstm.each_direction(lambda dirs: self._steps(layer, dirs, xs, keep, out))
        return out

    def _steps(self, layer: int, dirs: slice, xs: torch.Tensor, keep: torch.Tensor, out: torch.Tensor) -> None:
        """The window's steps of the directions ``dirs`` of ``layer``, into their rows of ``out``.
        Shape: xs (2, T*R, P), keep (T+1, R), out (2, T*R, P)."""
        k, (cell_clip, proj_clip) = self.lstm.kernels, self.clips
        w_state, w_proj = (w[dirs] for w in self.lstm.products(layer))  # (D, P, 4C), (D, C, P)
        R = self.shape.rows
        steps = [(t * R, R) for t in range(self.shape.steps)]
        h, c, mask = self.h[layer, dirs], self.c[layer, dirs], keep[:, None, :, None]  # (D, R, P), (D, R, C), (T+1, 1, R, 1)
        out = out[dirs]  # (D, T*R, P)
        parts = input_parts(xs[dirs], steps, xs.shape[1], self.lstm.input_projection(layer, dirs))  # one product a window
        packed = self.lstm.packed_products(layer)
        for t, gx_t in enumerate(parts):
            if packed is None:
                m = k.cell(gx_t, torch.bmm(h, w_state), c, mask[t], cell_clip, self.lstm.dtype)  # (D, R, C)
                k.store(torch.bmm(m, w_proj), out[:, t * R : (t + 1) * R], h, mask[t + 1], proj_clip)
                continue
            for d, (w_s, w_p) in enumerate(packed[dirs]):  # a CPU's packed oneDNN products, one direction at a time
                m = k.cell(gx_t[d][None], w_s(h[d])[None], c[d : d + 1], mask[t], cell_clip, self.lstm.dtype)
                k.store(w_p(m[0])[None], out[d : d + 1, t * R : (t + 1) * R], h[d : d + 1], mask[t + 1], proj_clip)
