"""The biLM's recurrence for inference: ``BiLstmStack.run_layer``'s maths, faster, autograd off.

What it does that the reference (``elmo_core.lstm``) does not:
- each step's output is written once, into its rows of the layer's output (on a CPU one buffer
  per layer, reused batch after batch), and read from there as the next step's recurrent input;
  the cell state is updated in place;
- the input part of the gates (``x W_in + b``) is computed a chunk of whole steps at a time
  (``chunk_rows``), not for the whole batch at once;
- on x86 CPUs all three products (input, recurrent, projection) use oneDNN weights packed once
  (``inference.packed_gemm``), per direction, for matrices of ``packed_min_weights`` weights and
  up (MKL's fp32 kernels on AMD CPUs with AVX-512 are its AVX2 ones); else the input part goes
  into one reused buffer by a batched product;
- a small model's fp32 steps on a CPU (plain products) run a chunk at a time as one TorchScript loop
  (``inference.scripted_steps``): Python's dispatch of their small kernels, serialised by the GIL
  across the direction threads, would be most of a step;
- bf16 / fp16 products (``inference.precision``): weight copies made once, inputs rounded, results
  fp32; bf16 on a CPU with bf16 instructions through packed oneDNN weights.

Tested against the reference: tests/core/test_bilm.py (every option, both GEMM paths),
tests/inference/test_fast_path.py, tests/inference/test_precision.py,
tests/inference/test_scripted_steps.py.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable, Iterator

import numpy as np
import torch

from elmo_core import ElmoConfig
from elmo_core.fused_sequence import last_positions
from elmo_core.lstm import BiLstmStack, Packing
from elmo_core.lstm_cell import low_bmm

from .directions import DirectionThreads, split
from .packed_gemm import PackedLinear, packed_gemm_available, weights_key
from .precision import cpu_bf16
from .scripted_steps import WHOLE_SIGMOID_MAX_CELL, scripted_chunk

# Rows of the input projection computed at a time: (2, 512, 4C) floats is 64 MiB at full size,
# where the whole batch at once (2, N, 4C) was 512 MiB for a 4096-token batch. GEMMs of 512 rows
# run at full speed.
INPUT_CHUNK_ROWS = 512
# ... or more rows, as many as a direction's input pre-activations (rows x 4C) fit in this many floats (8 MiB,
# 16 MiB both): a small model's input product in one or a few GEMMs a layer (oneDNN makes a primitive for each
# new row count, ~0.4 ms, so many small chunks of changing row counts lose what its packed weights gain)
INPUT_CHUNK_FLOATS = 1 << 21
# Pre-packed oneDNN products for the recurrent step only from this many weights per matrix (P x 4C)
# up. Measured on a 2-core AMD EPYC, model alone: full size (512 x 16384) 570 vs 488 tokens/s with
# and without; the shipped small config (128 x 4096) 7.0k vs 7.6k; a 512 x 32 one 35k vs 45k: on
# small matrices oneDNN's per-shape primitive set-up costs more than it saves.
PACKED_MIN_WEIGHTS = 1 << 22
BOTH = slice(0, 2)  # both directions of the (2, ...) tensors


def packed_products(config: ElmoConfig) -> bool:
    """Whether a CPU runs this model's recurrent products on packed oneDNN weights (bf16 on them
    with AMX / AVX512-BF16): matrices of ``PACKED_MIN_WEIGHTS`` and up."""
    return config.lstm.recurrent_weights >= PACKED_MIN_WEIGHTS


def lstm_step_inplace(gates: torch.Tensor, c_prev: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor],
                      cell_clip: float | None, proj_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``elmo_core.lstm_cell.lstm_step`` in place: ``gates`` is overwritten and ``c_prev`` (a view
    into the caller's state buffer) becomes the new cell state, which is returned; ``project``
    applies W_P (a pre-packed oneDNN product on x86 CPUs). No autograd.

    Shape: gates (..., N, 4C), c_prev (..., N, C) -> h (..., N, P), c (..., N, C) (c_prev itself).
    """
    C = c_prev.shape[-1]
    gates[..., :C].sigmoid_()  # i
    tanh_(gates[..., C : 2 * C])  # j
    gates[..., 2 * C :].sigmoid_()  # f, o
    i, j, f, o = gates.chunk(4, dim=-1)  # (..., N, C) each
    c = c_prev.mul_(f).addcmul_(i, j)  # (..., N, C): f c_prev + i j, in c_prev's buffer
    if cell_clip is not None:
        c.clamp_(-cell_clip, cell_clip)
    h = project(o.mul_(tanh_(c, out=j)))  # (..., N, P): tanh(c) over j, already used
    if proj_clip is not None:
        h.clamp_(-proj_clip, proj_clip)
    return h, c


def tanh_(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``tanh(x)`` into ``out`` (default ``x`` itself); no autograd. In fp32 on a CPU where numpy
    runs its SIMD tanh (``numpy_simd_tanh``), numpy's: 13x ATen's, which runs MKL's vector tanh in
    the high-accuracy mode ATen asks for (torch 2.13, numpy 2.4, Zen 5, one core, 104 x 4,096
    floats: 70 vs 896 us; AVX2 code on both sides, 401 vs 988; ~10 % of a full-size fp32 step on
    packed weights), within 6e-8 of the exact value (ATen's 3e-8; ``2 sigmoid(2x) - 1``, the
    compiled kernels' form, 1.8e-7, took a peer's layer past 1e-5); elsewhere ATen's. Shape: any."""
    out = x if out is None else out
    plain = (x.device.type == out.device.type == "cpu" and x.dtype == out.dtype == torch.float32
             and x.shape == out.shape and not (x.requires_grad or out.requires_grad))
    if not (plain and numpy_simd_tanh()):
        return torch.tanh(x, out=out)
    np.tanh(x.numpy(), out=out.numpy())
    return out


@functools.cache
def numpy_simd_tanh() -> bool:
    """Whether numpy runs its SIMD float32 tanh on this CPU: x86 with AVX2 and FMA3 (numpy's X86_V3
    and up, unless ``NPY_DISABLE_CPU_FEATURES`` turns them off). Its plain code is 7x slower than
    ATen's (6.2 ms for the floats above) and within 1.0e-7 only."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as found
    return bool(found.get("X86_V3", found.get("AVX2") and found.get("FMA3")))


class FastLstm:
    """``run_layer(layer, xs, pack, h, c)`` as ``BiLstmStack.run_layer`` computes it, for inference.

    ``dtype``: the type the products' inputs are rounded to (fp32: none); ``chunk_rows``: the rows
    of the input product computed at a time (default: ``INPUT_CHUNK_ROWS``, or more where
    ``INPUT_CHUNK_FLOATS`` allows); ``directions``: each
    direction on a thread of its own where ``split_directions`` (False: never). Weight copies and
    packed weights are made on first use and remade when the stack's parameters change.
    """

    def __init__(self, stack: BiLstmStack, dtype: torch.dtype = torch.float32, chunk_rows: int | None = None,
                 packed_min_weights: int = PACKED_MIN_WEIGHTS, directions: bool = True) -> None:
        self.stack, self.dtype = stack, dtype
        self.chunk_rows = chunk_rows or max(INPUT_CHUNK_ROWS, INPUT_CHUNK_FLOATS // stack.w_input.shape[-1])
        self.directions = DirectionThreads() if directions else None
        self.packed_min_weights = packed_min_weights
        self._copies: tuple = (None, ())  # (key, (W_in, W_h, W_P) in dtype)
        self._packed: tuple = (None, [])  # (key, per layer and direction (W_h, W_P, W_in) packed)
        self._outputs: tuple[int, dict[int, torch.Tensor]] = (0, {})  # ``_output``'s (thread, buffer per layer)

    def run_layer(self, layer: int, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each step's output is written once, into its rows of ``out``, and read from there as the
        next step's recurrent input (the rows still running are a prefix of the previous step's).
        On a CPU with an even count of threads each direction runs on its own thread
        (``inference.directions``). Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c."""
        out = self._output(layer, xs)  # (2, N, P)
        c = c.clone()  # (2, B, C): this layer's cell state, updated in place
        self.each_direction(lambda dirs: self._run_steps(layer, dirs, xs, pack, h, c, out))
        return out, final_h(out, pack, h), c

    def _run_steps(self, layer: int, dirs: slice, xs: torch.Tensor, pack: Packing, h: torch.Tensor, c: torch.Tensor,
                   out: torch.Tensor) -> None:
        """``run_layer``'s steps of the directions ``dirs``, into their rows of ``out`` and ``c``."""
        xs, h, c, out = xs[dirs], h[dirs], c[dirs], out[dirs]  # (D, N, P), (D, B, P), (D, B, C), (D, N, P)
        if self.scripted():
            self._run_scripted(layer, dirs, xs, pack, h, c, out)
            return
        step, prev = self._step(layer, dirs), h  # prev (D, >= n, P): the recurrent input of the next step
        parts = input_parts(xs, pack.steps, self.chunk_rows, self.input_projection(layer, dirs))
        for (start, n), gx_t in zip(pack.steps, parts):
            dest = out[:, start : start + n]  # (D, n, P)
            step(gx_t, prev[:, :n], c[:, :n], dest)  # c[:, :n] now holds the new cell state
            if pack.shared_first and start == 0:  # step 0 ran once: its state holds for every row
                prev, c[:] = dest.expand(-1, h.shape[1], -1), c[:, :1].clone()
            else:
                prev = dest

    def scripted(self) -> bool:
        """Whether the steps run as one TorchScript loop a chunk (``inference.scripted_steps``): fp32
        on a CPU with plain products (a model below ``packed_min_weights``), where this torch scripts it."""
        return (self.dtype == torch.float32 and self.stack.w_state.device.type == "cpu" and not self._use_packed()
                and scripted_chunk() is not None)

    def _run_scripted(self, layer: int, dirs: slice, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                      c: torch.Tensor, out: torch.Tensor) -> None:
        """``_run_steps`` as ``scripted_steps`` runs it: a chunk of steps a call, the input part of the
        gates computed a chunk at a time as on the other paths. Shape: as ``_run_steps``'s, sliced."""
        run, (cell_clip, proj_clip) = scripted_chunk(), self.stack.clips
        w_state, w_proj = self.stack.w_state[layer][dirs].detach(), self.stack.w_proj[layer][dirs].detach()
        clips = (None if cell_clip is None else float(cell_clip), None if proj_clip is None else float(proj_clip))
        whole, prev = c.shape[-1] <= WHOLE_SIGMOID_MAX_CELL, h  # prev (D, >= n, P): the next step's recurrent input
        for i, j, gx in input_chunks(xs, pack.steps, self.chunk_rows, self.input_projection(layer, dirs)):
            starts, rows = [s for s, _ in pack.steps[i:j]], [n for _, n in pack.steps[i:j]]
            prev = run(gx, starts[0], prev, c, w_state, w_proj, out, starts, rows, pack.shared_first, *clips, whole)

    def split_directions(self) -> bool:
        """Whether the directions run on threads of their own: on a CPU, ``directions`` on, an even
        count of threads (``inference.directions.split``), whatever the products' size: a small
        model's steps are the smallest kernels, each of which a team of two would wake its
        sleeping worker for."""
        return self.directions is not None and self.stack.w_state.device.type == "cpu" and \
            split(torch.get_num_threads())

    def each_direction(self, steps: Callable[[slice], None]) -> None:
        """``steps(dirs)`` for each direction on a thread of its own where ``split_directions``, else
        once for both (``BOTH``); the weights are packed (or copied) here, before any thread reads them."""
        if not self.split_directions():
            steps(BOTH)
            return
        if self.per_direction_products() or self._packed_input():
            self._packed_weights()
        self.weight_copies()
        self.scripted()  # its loop compiled here, once, not by both threads at once
        assert self.directions is not None
        self.directions.run(lambda d: steps(slice(d, d + 1)))

    def per_direction_products(self) -> bool:
        """The recurrent and projection products run one direction at a time on packed oneDNN
        weights: a CPU, fp32, or bf16 where oneDNN runs it."""
        return self._use_packed() and (self.dtype == torch.float32 or self._packed_low())

    def _output(self, layer: int, xs: torch.Tensor) -> torch.Tensor:
        """``run_layer``'s output buffer: on a CPU one per layer, reused batch after batch by the
        thread that ran last (grown as needed; a fresh multi-MB tensor a batch costs as much in
        page faults as its steps' products write), so a layer's output holds until its next
        ``run_layer``; another thread starts its own; elsewhere a new tensor.
        Shape: xs (2, N, P_in) -> (2, N, P)."""
        shape = (xs.shape[0], xs.shape[1], self.stack.cfg.projection_dim)
        if xs.device.type != "cpu":
            return xs.new_empty(shape)
        owner, held = self._outputs
        if owner != threading.get_ident():
            held = {}
            self._outputs = (threading.get_ident(), held)
        size = shape[0] * shape[1] * shape[2]
        if layer not in held or held[layer].numel() < size or held[layer].dtype != xs.dtype:
            held[layer] = xs.new_empty(size)
        return held[layer][:size].view(shape)

    def _step(self, layer: int, dirs: slice) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]:
        """One step of the directions ``dirs``, its output written into ``out``.

        Shape: gx (D, n, 4C), h (D, n, P), c (D, n, C), out (D, n, P); ``c`` is updated in place.
        """
        clips = self.stack.clips
        if self._packed_low():
            return self._packed_low_step(layer, dirs)
        if self.dtype != torch.float32:
            w_state, w_proj = (w[layer][dirs] for w in self.weight_copies()[1:])  # (D, P, 4C), (D, C, P) reduced
            return lambda gx, h, c, out: lstm_step_inplace(
                low_bmm(h, w_state).add_(gx), c, lambda m: out.copy_(low_bmm(m, w_proj)), *clips)
        if not self._use_packed():
            w_state, w_proj = self.stack.w_state[layer][dirs].detach(), self.stack.w_proj[layer][dirs].detach()
            return lambda gx, h, c, out: lstm_step_inplace(
                torch.baddbmm(gx, h, w_state), c, lambda m: torch.bmm(m, w_proj, out=out), *clips)
        packed = self._packed_weights()[layer][dirs]

        def step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, out: torch.Tensor) -> None:
            for d, (w_s, w_p, _) in enumerate(packed):
                lstm_step_inplace(w_s(h[d].contiguous()).add_(gx[d]), c[d], lambda m: out[d].copy_(w_p(m)), *clips)
        return step

    def _use_packed(self) -> bool:
        w = self.stack.w_state
        return packed_gemm_available(w.device) and w[0, 0].numel() >= self.packed_min_weights

    def _packed_low(self) -> bool:
        """bf16 products through oneDNN with weights packed once (AMX / AVX512-BF16 kernels on x86):
        on a CPU, for matrices as large as the fp32 packed path's."""
        return self.dtype == torch.bfloat16 and self._use_packed() and cpu_bf16().onednn  # not on AVX2-only CPUs

    def _packed_low_step(self, layer: int, dirs: slice) -> Callable[..., torch.Tensor]:
        """``_step`` in bf16 on packed weights: ``gx`` holds the input part in bf16
        (``input_projection``); one GEMM adds the recurrent product to it and rounds the sum to
        bf16 once; the gates, the cell state and the clips are fp32, as in every precision.

        Shape: gx (D, n, 4C) bf16 (or D of (n, 4C)), h (D, n, P), c (D, n, C) fp32, out (D, n, P).
        """
        low, packed, clips = self.dtype, self._packed_weights()[layer][dirs], self.stack.clips

        def step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, out: torch.Tensor) -> None:
            for d, (w_s, w_p, _) in enumerate(packed):
                gates = w_s.add(h[d].to(low), gx[d]).float()  # (n, 4C): h W_h + gx, rounded to bf16 once
                lstm_step_inplace(gates, c[d], lambda m: out[d].copy_(w_p(m.to(low))), *clips)
        return step

    def input_projection(self, layer: int, dirs: slice) -> Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]:
        """The input part of the gates of the directions ``dirs`` for a chunk of packed rows, ``x W_in + b``.

        Where the step's products run per direction on packed oneDNN weights
        (``per_direction_products``), so does this one, bias added inside the GEMM (in bf16: the
        result bf16); else fp32 into one reused buffer, or bf16 / fp16 with the products' inputs
        rounded and the result fp32. Shape: x (D, rows, P) -> (D, rows, 4C), or D of (rows, 4C)
        on packed weights.
        """
        bias = self.stack.gate_bias(layer).detach()[dirs]  # (D, 1, 4C)
        if self.per_direction_products():
            packed, b = self._packed_weights()[layer][dirs], bias[:, 0]  # b (D, 4C) fp32
            return lambda x: tuple(w_in(x[d].to(self.dtype), b[d]) for d, (_, _, w_in) in enumerate(packed))
        w_input = self.weight_copies()[0][layer][dirs]  # (D, P, 4C)
        if w_input.dtype != torch.float32:
            return lambda x: torch.add(torch.bmm(x.to(w_input.dtype), w_input), bias)
        packed = [w_in for _, _, w_in in self._packed_weights()[layer][dirs]] if self._packed_input() else []
        buffer: list[torch.Tensor] = []

        def project(x: torch.Tensor) -> torch.Tensor:
            size = x.shape[0] * x.shape[1] * w_input.shape[-1]
            if not buffer or buffer[0].numel() < size:
                buffer[:] = [x.new_empty(size)]
            gx = buffer[0][:size].view(x.shape[0], x.shape[1], -1)  # (D, rows, 4C)
            if not packed:
                return torch.baddbmm(bias, x, w_input, out=gx)
            for d, w_in in enumerate(packed):
                gx[d].copy_(w_in(x[d], bias[d, 0]))
            return gx
        return project

    def _packed_input(self) -> bool:
        """The fp32 input product (chunks of ``chunk_rows`` rows) on packed oneDNN weights whatever
        the model's size, where the recurrent products are too small for them: MKL's batched
        product ran it at half the rate on a Zen 5 (one core, 2 x 512 rows of 512 @ 512 x 32:
        353 against 177 us)."""
        return self.dtype == torch.float32 and packed_gemm_available(self.stack.w_input.device)

    def _key(self, params: tuple[torch.Tensor, ...]) -> tuple:
        return (self.dtype,) + weights_key(params)

    def weight_copies(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_in, W_h, W_P) in ``dtype``: the parameters themselves in fp32, else copies made once.

        Shape: (L, 2, P, 4C), (L, 2, P, 4C), (L, 2, C, P).
        """
        params = (self.stack.w_input, self.stack.w_state, self.stack.w_proj)
        if self.dtype == torch.float32:
            return tuple(w.detach() for w in params)  # type: ignore[return-value]
        if self._copies[0] != self._key(params):
            self._copies = (self._key(params), tuple(w.detach().to(self.dtype) for w in params))
        return self._copies[1]

    def _packed_weights(self) -> list[list[tuple[PackedLinear, PackedLinear, PackedLinear]]]:
        """Per layer and direction (W_h, W_P, W_in) in ``dtype``, packed once. W_in too in fp32: the
        plain batched product runs MKL, whose fp32 kernels on AMD CPUs with AVX-512 are its AVX2
        ones (a Zen 5, one core, 512 x 512 @ 512 x 16,384: 92 GFLOP/s against oneDNN's packed 220)."""
        s = self.stack
        params = (s.w_state, s.w_proj, s.w_input)
        if self._packed[0] != self._key(params):
            pack = lambda w: PackedLinear(w.detach().to(self.dtype))  # noqa: E731
            self._packed = (self._key(params), [
                [(pack(s.w_state[l, d]), pack(s.w_proj[l, d]), pack(s.w_input[l, d])) for d in range(2)]
                for l in range(s.cfg.n_layers)])
        return self._packed[1]


def input_chunks(xs: torch.Tensor, steps: list[tuple[int, int]], chunk_rows: int,
                 project: Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]) -> Iterator:
    """``(i, j, gx)``: the input pre-activations of ``steps[i:j]``, whole steps, as many as
    ``chunk_rows`` rows hold (at least one step). ``project`` may reuse its buffer: each chunk must
    be consumed before the next is drawn.
    Shape: xs (2, N, P) -> gx (2, rows, 4C), or a pair of (rows, 4C) where ``project`` gives pairs.
    """
    i = 0
    while i < len(steps):
        j, rows = i, 0
        while j < len(steps) and (rows == 0 or rows + steps[j][1] <= chunk_rows):
            rows += steps[j][1]
            j += 1
        yield i, j, project(xs[:, steps[i][0]:steps[i][0] + rows])
        i = j


def input_parts(xs: torch.Tensor, steps: list[tuple[int, int]], chunk_rows: int,
                project: Callable[[torch.Tensor], torch.Tensor | tuple[torch.Tensor, ...]]) -> Iterator:
    """Each step's input pre-activations, computed a chunk of whole steps at a time (``input_chunks``).
    Shape: xs (2, N, P) -> per step (2, n_t, 4C), or a pair of (n_t, 4C) where ``project`` gives pairs.
    """
    for i, j, gx in input_chunks(xs, steps, chunk_rows, project):
        sizes = [n for _, n in steps[i:j]]
        if isinstance(gx, tuple):
            yield from zip(*(g.split(sizes, dim=0) for g in gx))
        else:
            yield from gx.split(sizes, dim=1)


def final_h(out: torch.Tensor, pack: Packing, h: torch.Tensor) -> torch.Tensor:
    """Each row's last output (its state after the layer; a row that never ran keeps ``h``).

    Shape: out (2, N, P), h (2, B, P) -> (2, B, P).
    """
    index = torch.tensor(last_positions(pack.steps, h.shape[1], pack.shared_first), device=out.device)  # (B,)
    return torch.where((index >= 0)[None, :, None], out[:, index.clamp(min=0)], h)
