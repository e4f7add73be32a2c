"""The stacked bidirectional LSTM with projection, cell clipping and projection clipping.

Both directions run together as batched matrix products. Rows are sorted by length so that the
rows still running at step t are a prefix (the active set shrinks as sentences end); the backward
direction reads each sentence reversed within its own length, so it has the same active set.
Padded positions neither change the state nor emit output.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterator

import torch
from torch import nn

from .config import LstmConfig
from .lstm_cell import lstm_step, lstm_step_inplace
from .lstm_sequence import carry_state, lstm_sequence
from .packed_gemm import PackedLinear, packed_gemm_available
from .precision import low_bmm


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

    # Inference computes the input projection for about this many packed rows at a time, into one
    # reused buffer: (2, 512, 4C) floats is 64 MiB at full size, where the whole batch at once
    # (2, N, 4C) was 512 MiB for a 4096-token batch. GEMMs of 512 rows run at full speed.
    input_chunk_rows = 512
    # Pre-packed oneDNN products for the recurrent step only from this many weights per matrix
    # (P x 4C) up. Measured on a 2-core AMD EPYC, model alone: full size (512 x 16384) 570 vs 488
    # tokens/s with and without; the shipped small config (128 x 4096) 7.0k vs 7.6k; a 512 x 32 one
    # 35k vs 45k: on small matrices oneDNN's per-shape primitive set-up costs more than it saves.
    packed_gemm_min_weights = 1 << 22
    # The training (autograd) path's cell; ``elmo train --compile`` swaps in a compiled one. With the
    # default cell a layer's whole recurrence is one autograd function (lstm_sequence.LstmSequence):
    # the same maths, a fused backward, batched weight gradients; under autocast its products run
    # in the autocast type and everything else in fp32.
    train_cell: Callable[..., tuple[torch.Tensor, torch.Tensor]] = staticmethod(lstm_step)
    # Inference only: the type the matrix products' inputs are rounded to (bf16 / fp16 copies of the
    # weights, results in fp32; see elmo_core.precision). Training ignores it.
    matmul_dtype: torch.dtype = torch.float32

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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, state: LstmState | None = None,
                boundary_shortcut: bool = False) -> tuple[list[torch.Tensor], LstmState | None]:
        """Run every layer over length-masked rows.

        ``boundary_shortcut`` (stateless, rows framed by <S> ... </S>): each direction's first
        step sees the same boundary token from a zero state in every row, so it runs once and is
        shared; its last step (the other boundary) feeds nothing that is kept, so it is skipped.
        Outputs at that last position are then zero and no final state is returned.

        Shape: x (B, T, P) zero at padding, lengths (B,) -> L tensors (B, T, 2P), final state.
        """
        B, T, _ = x.shape
        shortcut = boundary_shortcut and state is None and B > 0 and bool((lengths >= 2).all())
        pack = Packing(lengths, T, shared_first=shortcut)
        outputs, final = self.run_packed(pack.pack(x), pack, state)  # L x (2, N, P)
        layers = [pack.unpack(o) for o in outputs]  # [(B, T, 2P)]
        return layers, None if shortcut else final

    def forward_combined(self, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor,
                         positions: slice = slice(None), keep: torch.Tensor | None = None) -> torch.Tensor:
        """``sum_j weights[j] * layer_j`` of the stateless stack (rows framed by <S> ... </S>, as
        ``forward`` with ``boundary_shortcut``), layer 0 being ``[x; x]``. The layers are combined
        while packed (see ``combine_packed``) and unpacked once, instead of L+1 unpacks and a
        stack: the inference fast path of a scalar mix, top or average
        (``elmo_core.scalar_mix.ScalarMix`` is the reference).

        Shape: x (B, T, P) zero at padding, lengths (B,) >= 2, weights (L+1,) -> (B, T', 2P) for
        ``positions`` (default all T), zero at padding, where ``keep`` (B, T') is False, and at each
        row's last position (the boundary the shortcut skips).
        """
        pack = Packing(lengths, x.shape[1], shared_first=x.shape[0] > 0)
        return pack.unpack(self.combine_packed(pack.pack(x), pack, weights), positions, keep)

    def combine_packed(self, xs: torch.Tensor, pack: "Packing", weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[j] * layer_j`` over packed inputs (the packed input is layer 0 of both
        directions, each in its own reading order), plus one zero row for ``Packing.unpack``.
        Stateless. Nothing here waits on the device, so it can be captured in a CUDA graph.

        Shape: xs (2, N, P), weights (L+1,) -> (2, N+1, P).
        """
        outputs, _ = self.run_packed(xs, pack)  # L x (2, N, P)
        N, P = xs.shape[1], xs.shape[2]
        combined = xs.new_empty(2, N + 1, P)  # the last row stays zero: unpacking reads it for padding
        combined[:, N] = 0
        torch.mul(xs, weights[0], out=combined[:, :N])
        for j, out in enumerate(outputs, start=1):
            combined[:, :N].addcmul_(out, weights[j])
        return combined

    def run_packed(self, xs: torch.Tensor, pack: "Packing",
                   state: LstmState | None = None) -> tuple[list[torch.Tensor], LstmState]:
        """Every layer over packed inputs of both directions (each read in its own order).

        Shape: xs (2, N, P) -> L outputs (2, N, P), final state (rows in the caller's order).
        """
        B = pack.shape[1]
        state = state if state is not None else self.zero_state(B)
        h0, c0 = state.h[:, :, pack.order], state.c[:, :, pack.order]  # (L, 2, B, P), (L, 2, B, C)
        outputs, h_fin, c_fin = [], [], []
        for layer in range(self.cfg.n_layers):
            if self.training and self.dropout > 0:
                xs = nn.functional.dropout(xs, self.dropout, training=True)
            out, h, c = self._run_layer(layer, xs, pack, h0[layer], c0[layer])  # (2, N, P)
            if layer > 0 and self.cfg.use_skip_connections:  # residual: the layer's input is added to its output
                out = out.add_(xs) if not torch.is_grad_enabled() else out + xs
            outputs.append(out)
            h_fin.append(h)
            c_fin.append(c)
            xs = out
        return outputs, LstmState(torch.stack(h_fin)[:, :, pack.inverse], torch.stack(c_fin)[:, :, pack.inverse])

    def _run_layer(self, layer: int, xs: torch.Tensor, pack: "Packing", h: torch.Tensor,
                   c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c."""
        bias = (self.bias[layer] + self.forget_offset)[:, None, :]  # (2, 1, 4C)
        if not torch.is_grad_enabled():
            return self._run_layer_inference(layer, xs, pack, h, c, bias)
        w_state, w_proj, w_input = self.w_state[layer], self.w_proj[layer], self.w_input[layer]
        if self.train_cell is lstm_step:
            dev = xs.device.type
            low = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
            with torch.autocast(dev, enabled=False):  # under autocast: products in ``low``, the rest fp32
                gx = torch.baddbmm(bias, xs, w_input) if low is None else \
                    torch.add(bias, low_bmm(xs.to(w_input.dtype), w_input.to(low)))  # (2, N, 4C): all steps' input part
                return lstm_sequence(gx, h, c, w_state, w_proj, pack.steps, pack.shared_first, *self._clips, low)
        gx = torch.baddbmm(bias, xs, w_input)  # (2, N, 4C)
        cell = self.train_cell
        step = lambda g, h_, c_: cell(torch.baddbmm(g, h_, w_state), c_, w_proj, *self._clips)  # noqa: E731
        # split: views whose gradients autograd joins with one cat (slicing per step would not)
        parts = gx.split([n for _, n in pack.steps], dim=1)
        outs = []
        for (start, n), gx_t in zip(pack.steps, parts):
            h_new, c_new = step(gx_t, h[:, :n], c[:, :n])  # (2, n, P), (2, n, C)
            outs.append(h_new)
            h, c = carry_state(h, c, h_new, c_new, pack.shared_first and start == 0)  # (2, B, P), (2, B, C)
        return torch.cat(outs, dim=1), h, c

    def _run_layer_inference(self, layer: int, xs: torch.Tensor, pack: "Packing", h: torch.Tensor, c: torch.Tensor,
                             bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_run_layer`` without autograd: each step's output is written straight into one buffer and
        the state is updated in place (the autograd path concatenates instead).

        Shape: xs (2, N, P), h (2, B, P), c (2, B, C), bias (2, 1, 4C) -> out (2, N, P), h, c.
        """
        out = xs.new_empty(xs.shape[0], xs.shape[1], self.cfg.projection_dim)  # (2, N, P)
        h, c = h.clone(), c.clone()  # (2, B, P), (2, B, C): this layer's state, updated in place
        step = self._inference_step(layer)
        parts = _input_parts(xs, pack.steps, self.input_chunk_rows, self._input_projection(layer, bias))
        for (start, n), gx_t in zip(pack.steps, parts):
            h_new = step(gx_t, h[:, :n], c[:, :n])  # (2, n, P); c[:, :n] now holds the new cell state
            out[:, start : start + n] = h_new
            if pack.shared_first and start == 0:  # step 0 ran once: its state holds for every row
                h[:], c[:] = h_new, c[:, :1].clone()
            else:
                h[:, :n] = h_new
        return out, h, c

    @property
    def _clips(self) -> tuple[float | None, float | None]:
        return self.cfg.cell_clip, self.cfg.proj_clip

    def _inference_step(self, layer: int) -> Callable[..., torch.Tensor]:
        """One step of both directions without autograd: oneDNN pre-packed weights for large matrices on x86.

        Shape: gx (2, n, 4C), h (2, n, P), c (2, n, C) -> h (2, n, P); ``c`` is updated in place.
        """
        if self._packed_low():
            return self._packed_low_step(layer)
        if self.matmul_dtype != torch.float32:
            w_state, w_proj = (w[layer] for w in self._matmul_weights()[1:])  # (2, P, 4C), (2, C, P) reduced
            return lambda gx, h, c: lstm_step_inplace(
                low_bmm(h, w_state).add_(gx), c, lambda m: low_bmm(m, w_proj), *self._clips)[0]
        if not packed_gemm_available(self.w_state.device) or self.w_state[0, 0].numel() < self.packed_gemm_min_weights:
            w_state, w_proj = self.w_state[layer], self.w_proj[layer]
            return lambda gx, h, c: lstm_step_inplace(
                torch.baddbmm(gx, h, w_state), c, lambda m: torch.bmm(m, w_proj), *self._clips)[0]
        packed = self._packed_weights()[layer]

        def step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            h_new = h.new_empty(h.shape)  # (2, n, P)
            for d, (w_s, w_p, _) in enumerate(packed):
                h_new[d] = lstm_step_inplace(w_s(h[d]).add_(gx[d]), c[d], w_p, *self._clips)[0]
            return h_new
        return step

    def _packed_low(self) -> bool:
        """bf16 products through oneDNN with weights packed once (AMX / AVX512-BF16 kernels on x86):
        on a CPU, for matrices as large as the fp32 packed path's."""
        return (self.matmul_dtype == torch.bfloat16 and packed_gemm_available(self.w_state.device)
                and torch.ops.mkldnn._is_mkldnn_bf16_supported()  # False on AVX2-only CPUs: no bf16 packing
                and self.w_state[0, 0].numel() >= self.packed_gemm_min_weights)

    def _packed_low_step(self, layer: int) -> Callable[..., torch.Tensor]:
        """``_inference_step`` in bf16 on packed weights: ``gx`` holds the input part in bf16
        (``_input_projection``); one GEMM adds the recurrent product to it and rounds the sum to
        bf16 once; the gates, the cell state and the clips are fp32, as in every precision.

        Shape: gx (2, n, 4C) bf16 (or a pair of (n, 4C)), h (2, n, P), c (2, n, C) fp32 -> h (2, n, P).
        """
        low, packed = self.matmul_dtype, self._packed_weights()[layer]

        def step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            h_new = h.new_empty(h.shape)  # (2, n, P)
            for d, (w_s, w_p, _) in enumerate(packed):
                gates = w_s.add(h[d].to(low), gx[d]).float()  # (n, 4C): h W_h + gx, rounded to bf16 once
                h_new[d] = lstm_step_inplace(gates, c[d], lambda m: w_p(m.to(low)).float(), *self._clips)[0]
            return h_new
        return step

    def _input_projection(self, layer: int, bias: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """The input part of the gates for a chunk of packed rows, ``x W_in + b`` (inference).

        fp32: into one reused buffer; bf16 / fp16: products' inputs rounded, result fp32; packed
        bf16: per direction, bf16, bias added inside the GEMM.
        Shape: x (2, rows, P) -> (2, rows, 4C), or a pair of (rows, 4C) on the packed bf16 path.
        """
        if self._packed_low():
            packed, b = self._packed_weights()[layer], bias[:, 0]  # b (2, 4C) fp32
            return lambda x: tuple(w_in(x[d].to(self.matmul_dtype), b[d]) for d, (_, _, w_in) in enumerate(packed))
        w_input = self._matmul_weights()[0][layer]  # (2, P, 4C)
        if w_input.dtype != torch.float32:
            return lambda x: torch.add(torch.bmm(x.to(w_input.dtype), w_input), bias)
        buffer: list[torch.Tensor] = []

        def project(x: torch.Tensor) -> torch.Tensor:
            size = x.shape[0] * x.shape[1] * w_input.shape[-1]
            if not buffer or buffer[0].numel() < size:
                buffer[:] = [x.new_empty(size)]
            return torch.baddbmm(bias, x, w_input, out=buffer[0][:size].view(x.shape[0], x.shape[1], -1))
        return project

    def _matmul_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_in, W_h, W_P) in ``matmul_dtype``: the parameters themselves in fp32, else copies made
        once (remade if the parameters or the type change).

        Shape: (L, 2, P, 4C), (L, 2, P, 4C), (L, 2, C, P).
        """
        params = (self.w_input, self.w_state, self.w_proj)
        if self.matmul_dtype == torch.float32:
            return tuple(w.detach() for w in params)  # type: ignore[return-value]
        key = (self.matmul_dtype,) + tuple((w._version, w.data_ptr()) for w in params)
        if getattr(self, "_matmul_key", None) != key:
            self._matmul_copies = tuple(w.detach().to(self.matmul_dtype) for w in params)
            self._matmul_key = key
        return self._matmul_copies

    def _packed_weights(self) -> list[list[tuple[PackedLinear, PackedLinear, PackedLinear | None]]]:
        """Per layer and direction (W_h, W_P, W_in) in ``matmul_dtype``, packed once, repacked if the
        parameters or the type change. fp32 leaves W_in out (its product runs as one large batched
        GEMM, where packing gains nothing)."""
        params = (self.w_state, self.w_proj, self.w_input)
        key = (self.matmul_dtype,) + tuple((w._version, w.data_ptr()) for w in params)
        if getattr(self, "_packed_key", None) != key:
            low = self.matmul_dtype
            pack = lambda w: PackedLinear(w.detach().to(low))  # noqa: E731
            self._packed = [[(pack(self.w_state[l, d]), pack(self.w_proj[l, d]),
                              pack(self.w_input[l, d]) if low != torch.float32 else None)
                             for d in range(2)] for l in range(self.cfg.n_layers)]
            self._packed_key = key
        return self._packed


def _input_parts(xs: torch.Tensor, steps: list[tuple[int, int]], chunk_rows: int,
                 project: Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]) -> Iterator:
    """Each step's input pre-activations, computed a chunk of whole steps at a time (inference only).

    ``project`` may reuse its buffer: each part must be consumed before the next is drawn.
    Shape: xs (2, N, P) -> per step (2, n_t, 4C), or a pair of (n_t, 4C) where ``project`` gives pairs.
    """
    i = 0
    while i < len(steps):
        j, rows = i, 0
        while j < len(steps) and (rows == 0 or rows + steps[j][1] <= chunk_rows):
            rows += steps[j][1]
            j += 1
        start, sizes = steps[i][0], [n for _, n in steps[i:j]]
        gx = project(xs[:, start:start + rows])  # (2, rows, 4C), or a pair of (rows, 4C)
        if isinstance(gx, tuple):
            yield from zip(*(g.split(sizes, dim=0) for g in gx))
        else:
            yield from gx.split(sizes, dim=1)
        i = j


class Packing:
    """Rows sorted by length, time-major, real positions only (as torch's PackedSequence).

    Step t's active rows are the first n_t of the sorted batch and sit contiguously at
    [offset_t, offset_t + n_t) of the packed axis. Direction 1 reads each row reversed within
    its length, so both directions share the packing. With ``shared_first`` step 0 packs only
    row 0, and unpacking copies its output to every row. ``every_step``: every row runs every step
    (padding included, after each row's real steps in both directions), so the packed axis is
    (T*B) time-major whatever the lengths: the static shape CUDA graphs need
    (``inference.cuda_graphs``). ``Packing.full(B, T)``: rows all T long.

    Packing and unpacking are one indexed gather each: ``sources`` (2, N) says where each packed
    position reads in the (B*T) axis, ``targets`` (2, B*T) which packed position each time step
    of each row comes from (N: none, a zero row). Both are built on first use: training runs
    ``Packing.full`` every step and never packs or unpacks.
    """

    def __init__(self, lengths: torch.Tensor, t_max: int, shared_first: bool = False,
                 every_step: bool = False) -> None:
        self.shared_first = shared_first and not every_step
        self.order = torch.argsort(lengths, descending=True, stable=True)  # (B,)
        self.inverse = torch.argsort(self.order)  # (B,)
        sorted_lengths = lengths[self.order]
        self._rev = reverse_index(sorted_lengths, t_max)  # (T, B)
        steps = sorted_lengths - 1 if shared_first else sorted_lengths  # the last step is skipped
        real = torch.arange(t_max, device=lengths.device)[:, None] < steps[None, :]  # (T, B)
        if every_step:  # the packed axis is (T*B) time-major, whatever the lengths
            real = torch.ones_like(real)
        elif shared_first:
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

    @classmethod
    def full(cls, batch: int, t_max: int, device: torch.device | None = None) -> "Packing":
        return cls(torch.full((batch,), t_max, dtype=torch.long, device=device), t_max)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """Shape: (B, T, P) -> (2, N, P)."""
        return x.reshape(-1, x.shape[-1])[self.sources]  # (2, N, P)

    def unpack(self, packed: torch.Tensor, positions: slice = slice(None), keep: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: (2, N, P) -> (B, T', 2P), zero at padding, the backward half in reading order.

        ``positions``: the time steps wanted (default all T); ``keep`` (B, T') bool: the positions
        to fill, the others zero. ``packed`` may carry one more row, all zero (2, N+1, P); else one
        is added.
        """
        T, B = self.shape
        N = self.sources.shape[1]
        if packed.shape[1] == N:
            packed = torch.cat([packed, packed.new_zeros(2, 1, packed.shape[-1])], dim=1)  # (2, N+1, P)
        targets = self.targets.view(2, B, T)[:, :, positions]  # (2, B, T')
        if keep is not None:
            targets = torch.where(keep, targets, N)
        index = torch.stack([targets[0], targets[1] + (N + 1)], dim=-1)  # (B, T', 2) into both directions
        return packed.reshape(2 * (N + 1), -1)[index].flatten(2)  # (B, T', 2P)
