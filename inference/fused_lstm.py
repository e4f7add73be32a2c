"""The inference recurrence with fused steps: each step is two products and two kernels.

``FusedLstm`` computes what ``FastLstm`` (and the reference ``BiLstmStack.run_layer``) computes,
over the same packing (rows sorted by length, the active rows shrinking), but each step is

    r = h W_h                      a product (cuBLAS / oneDNN)
    m = cell(gx + r, c)            one kernel: gates, the cell and its clip, m (c updated in place)
    h_raw = m W_P                  a product
    store(h_raw)                   one kernel: the projection's clip, the output, the next step's h

(``elmo_core.fused_cell``, compiled by ``torch.compile``), where the eager step launches about ten
kernels, six of them passes over the gate tensor. On CUDA a step's launches bound it; on a CPU
(``--layout fused``, ``inference.layout``) the products run on packed oneDNN weights, one direction
at a time, and the one pass over the gates is what it saves: in bf16 on an AMX Xeon the eager
passes cost about as much as the products. The next step's ``h`` is kept in the products' type by
``store``, so bf16 / fp16 steps cast nothing. Tested against the reference in tests/core/test_bilm.py
and tests/inference/test_precision.py (both layouts, every option and precision).
"""
from __future__ import annotations

from typing import Callable

import torch

from elmo_core.fused_cell import FusedCell, clip_tensor
from elmo_core.fused_sequence import last_positions
from elmo_core.lstm import BiLstmStack, Packing

from .fast_lstm import FastLstm, input_parts
from .packed_gemm import PackedLinear


class FusedLstm(FastLstm):
    """``FastLstm.run_layer`` with fused steps (module doc). ``kernels``: by default compiled on
    CUDA and the same functions uncompiled on a CPU (the CPU's fused layout passes the compiled
    ones). ``packed``: the products on packed oneDNN weights (a CPU; fp32, or bf16 where oneDNN
    runs it), else batched over the directions."""

    def __init__(self, stack: BiLstmStack, dtype: torch.dtype = torch.float32, chunk_rows: int | None = None,
                 kernels: FusedCell | None = None, packed: bool = False, directions: bool = True) -> None:
        super().__init__(stack, dtype, chunk_rows, packed_min_weights=0 if packed else 1 << 62, directions=directions)
        if kernels is None:
            kernels = FusedCell.compiled() if stack.w_input.device.type == "cuda" else FusedCell.eager()
        self.kernels = kernels

    def clips(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The cell and projection clips as the kernels take them (0-d tensors on ``device``)."""
        return clip_tensor(self.stack.cfg.cell_clip, device), clip_tensor(self.stack.cfg.proj_clip, device)

    def products(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """W_h and W_P of ``layer`` in the products' type. Shape: (2, P, 4C), (2, C, P)."""
        _, w_state, w_proj = self.weight_copies()
        return w_state[layer], w_proj[layer]

    def packed_products(self, layer: int) -> list[tuple[PackedLinear, PackedLinear]] | None:
        """W_h and W_P of ``layer`` per direction on packed oneDNN weights (a CPU; fp32, or bf16
        where oneDNN runs it), None where the products run batched over the directions."""
        if self.per_direction_products():
            return [(w_s, w_p) for w_s, w_p, _ in self._packed_weights()[layer]]
        return None

    def run_layer(self, layer: int, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c (final, per row)."""
        out = xs.new_empty(xs.shape[0], xs.shape[1], self.stack.cfg.projection_dim)  # (2, N, P)
        h_next, c = h.to(self.dtype).clone(), c.clone()  # (2, B, P) the products' input, (2, B, C) fp32

        def steps(dirs: slice) -> None:
            step, state, cell, dest = self._fused_step(layer, xs.device, dirs), h_next[dirs], c[dirs], out[dirs]
            parts = input_parts(xs[dirs], pack.steps, self.chunk_rows, self.input_projection(layer, dirs))
            for (start, n), gx_t in zip(pack.steps, parts):
                step(gx_t, state[:, :n], cell[:, :n], dest[:, start : start + n])
                if pack.shared_first and start == 0:  # step 0 ran once: its state holds for every row
                    state[:], cell[:] = state[:, :1].clone(), cell[:, :1].clone()
        self.each_direction(steps)
        return out, self._final_h(out, pack, h), c

    def _fused_step(self, layer: int, device: torch.device, dirs: slice) -> Callable[..., None]:
        """One step of the directions ``dirs``: ``h`` becomes the next step's input, ``c`` the new
        cell state, ``out`` the step's output. Products batched over the directions, or on the CPU's
        packed oneDNN weights one direction at a time (``gx`` then D of (n, 4C)).

        Shape: gx (D, n, 4C), h (D, n, P) in the products' type, c (D, n, C), out (D, n, P).
        """
        k, (cell_clip, proj_clip) = self.kernels, self.clips(device)
        packed = self.packed_products(layer)
        if packed is not None:
            packed = packed[dirs]

            def packed_step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, out: torch.Tensor) -> None:
                for d, (w_s, w_p) in enumerate(packed):
                    m = k.cell(gx[d][None], w_s(h[d])[None], c[d : d + 1], None, cell_clip, self.dtype)  # (1, n, C)
                    k.store(w_p(m[0])[None], out[d : d + 1], h[d : d + 1], None, proj_clip)
            return packed_step
        w_state, w_proj = (w[dirs] for w in self.products(layer))

        def step(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, out: torch.Tensor) -> None:
            m = k.cell(gx, torch.bmm(h, w_state), c, None, cell_clip, self.dtype)  # (D, n, C)
            k.store(torch.bmm(m, w_proj), out, h, None, proj_clip)
        return step

    def _final_h(self, out: torch.Tensor, pack: Packing, h: torch.Tensor) -> torch.Tensor:
        """Each row's last output (its state after the layer; a row that never ran keeps ``h``), fp32.

        Shape: out (2, N, P), h (2, B, P) -> (2, B, P).
        """
        index = torch.tensor(last_positions(pack.steps, h.shape[1], pack.shared_first), device=out.device)  # (B,)
        return torch.where((index >= 0)[None, :, None], out[:, index.clamp(min=0)], h)
