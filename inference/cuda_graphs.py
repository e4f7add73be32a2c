"""The biLM's recurrence replayed as one CUDA graph per job: no per-step kernel launches from Python.

``RowGraphs`` is ``BiLstmStack.forward_combined`` (same signature, same vectors) over the static
row layout of ``inference.row_lstm``: each batch's sentences are laid end to end in R rows
(``RowPlan``) and run T steps at a time by ``RowLstm.window``, whose shapes never change, so one
graph, captured at the first window, replays every window of every batch: a window's
sentences gathered into its input buffer, the graph replayed, its mix copied out. The state of
every layer is carried from window to window inside the graph's buffers and zeroed at each
batch's start. Padding is only what the rows leave empty in a batch's last window
(``RowPlan.padded_fraction``).

The shape: ``RowShape.for_tokens`` of the first batch's token count (about 16 windows a batch)
unless given. ``RowGraphs(..., capture=False)`` runs the same windows eagerly (any device): that
is how it is tested on a CPU against ``BiLstmStack.forward_combined``; capture and replay are
tested on a GPU (tests/gpu).
"""
from __future__ import annotations

import torch

from .fused_lstm import FusedLstm
from .row_lstm import RowLstm, RowPlan, RowShape


class RowGraphs:
    """``forward_combined`` over windows of one static shape, replayed as one CUDA graph
    (``capture=True``, CUDA only) or run eagerly (module doc)."""

    def __init__(self, lstm: FusedLstm, shape: RowShape | None = None, capture: bool = True) -> None:
        self.lstm, self.shape, self.capture = lstm, shape, capture
        self.rows: RowLstm | None = None
        self.graph: "torch.cuda.CUDAGraph | None" = None
        self.captures = self.replays = 0
        self.padded = self.positions = 0  # padded and all positions computed so far

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor,
                 positions: slice = slice(None), keep: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: x (B, T, P) zero at padding, lengths (B,), weights (L+1,) -> (B, T', 2P)."""
        B, T, P = x.shape
        plan = RowPlan(lengths.tolist(), T, self._shape(int(lengths.sum())), x.device)
        rows = self._rows()
        xs, keep_buf, weights_buf, _ = self.buffers
        n = xs.shape[1]  # T*R positions a window
        flat = torch.cat([x.reshape(B * T, P), x.new_zeros(1, P)])  # (B*T+1, P): the last row is padding's
        combined = x.new_empty(2, plan.windows * n + 1, P)  # (2, W*T*R+1, P)
        combined[:, -1] = 0
        rows.reset()
        weights_buf.copy_(weights)
        for w in range(plan.windows):
            sources, keep_w = plan.window(w)
            torch.index_select(flat, 0, sources.reshape(-1), out=xs.view(-1, P))  # (2*T*R, P)
            keep_buf.copy_(keep_w)
            combined[:, w * n : (w + 1) * n] = self._run(rows)
        self.positions += plan.windows * n
        self.padded += plan.windows * n - plan.tokens
        return plan.unpack(combined, positions, keep)

    def _shape(self, tokens: int) -> RowShape:
        if self.shape is None:
            self.shape = RowShape.for_tokens(tokens)
        return self.shape

    def _rows(self) -> RowLstm:
        """The window runner and its static input buffers (xs (2, T*R, P), keep (T+1, R), weights (L+1,))."""
        if self.rows is None:
            assert self.shape is not None
            self.rows = RowLstm(self.lstm, self.shape)
            cfg, dev = self.lstm.stack.cfg, self.rows.h.device
            R, T = self.shape.rows, self.shape.steps
            self.buffers = (torch.zeros(2, T * R, cfg.projection_dim, device=dev),
                            torch.ones(T + 1, R, dtype=torch.bool, device=dev),
                            torch.zeros(cfg.n_layers + 1, device=dev), None)
        return self.rows

    def _run(self, rows: RowLstm) -> torch.Tensor:
        """One window on the static buffers: replayed when captured, else run (and, on the first
        window with ``capture``, captured). Returns the window's mix (2, T*R, P)."""
        xs, keep, weights, out = self.buffers
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return out
        if not self.capture:
            return rows.window(xs, keep, weights)
        return self._capture(rows)

    def _capture(self, rows: RowLstm) -> torch.Tensor:
        """Warm up on a side stream (as torch.cuda.graphs requires; the kernels compile here),
        then capture one window. The warm-up's result is this window's: the state is restored
        before the capture so that the captured run computes it again."""
        xs, keep, weights, _ = self.buffers
        saved = rows.h.clone(), rows.c.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            rows.window(xs, keep, weights)
        torch.cuda.current_stream().wait_stream(side)
        rows.h.copy_(saved[0])
        rows.c.copy_(saved[1])
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # other threads may use CUDA meanwhile
            out = rows.window(xs, keep, weights)  # (2, T*R, P), static
        self.buffers = (xs, keep, weights, out)
        self.graph.replay()  # capturing does not run the work
        self.captures += 1
        return out

    def memory_bytes(self) -> int:
        """Bytes of the static buffers and the carried state (the graph's private pool holds the
        intermediates besides: ``torch.cuda.memory_reserved`` reports the whole)."""
        if self.rows is None:
            return 0
        tensors = [t for t in self.buffers if t is not None] + [self.rows.h, self.rows.c]
        return sum(t.numel() * t.element_size() for t in tensors)
