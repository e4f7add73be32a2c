"""The biLM's recurrence replayed as CUDA graphs of one static window: no per-step kernel launches from Python.

``RowGraphs`` is ``BiLstmStack.forward_combined`` (same signature, same vectors) over the static
row layout of ``inference.row_lstm``: each batch's sentences are laid end to end in rows
(``RowPlan``) and run T steps at a time by ``RowLstm.window``, whose shapes never change, so a
graph captured at the first window replays every later window of that many rows: a window's
sentences gathered into its input buffer, the graph replayed, its mix copied out. The state of
every layer is carried from window to window inside the graph's buffers and zeroed at each
batch's start. Padding is only what the rows leave empty in a batch's last window
(``RowPlan.padded_fraction``).

The shape: windows of 8 steps, each batch in the power of two of rows up to 1024
(``RowShape()``) that runs it fastest (``RowShape.for_batch``: a small batch, or one of few long
sentences, takes fewer rows), so a job keeps one graph per row count it meets (a sotu job at a
GPU's token budget: two or three). ``RowGraphs(..., capture=False)`` runs the same windows eagerly (any device): that
is how it is tested on a CPU against ``BiLstmStack.forward_combined``; capture and replay are
tested on a GPU (tests/gpu).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .fused_lstm import FusedLstm
from .row_lstm import RowLstm, RowPlan, RowShape, keep_buffer


@dataclass
class _Window:
    """One row count's runner and static buffers: xs (2, T*R, P), keep (T+1, R) (``keep_buffer``), weights (L+1,),
    and once captured, the graph and its output (2, T*R, P)."""

    rows: RowLstm
    xs: torch.Tensor
    keep: torch.Tensor
    weights: torch.Tensor
    graph: "torch.cuda.CUDAGraph | None" = None
    out: torch.Tensor | None = None


class RowGraphs:
    """``forward_combined`` over windows of static shapes, replayed as CUDA graphs
    (``capture=True``, CUDA only) or run eagerly (module doc). ``step_rows``: see ``RowShape.for_batch``."""

    def __init__(self, lstm: FusedLstm, shape: RowShape = RowShape(), capture: bool = True,
                 step_rows: int = 128) -> None:
        self.lstm, self.shape, self.capture, self.step_rows = lstm, shape, capture, step_rows
        self.windows: dict[int, _Window] = {}
        self.captures = self.replays = 0
        self.padded = self.positions = 0  # padded and all positions computed so far

    def plan(self, lengths: list[int], t_in: int) -> RowPlan:
        """A batch's rows, planned on the host (``RowPlan.to`` puts them on the device)."""
        return RowPlan(lengths, t_in, self.shape.for_batch(lengths, self.step_rows), "cpu")

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor,
                 positions: slice = slice(None), keep: torch.Tensor | None = None,
                 plan: RowPlan | None = None, take: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: x (B, T, P) zero at padding, lengths (B,), weights (L+1,) -> (B, T', 2P), or
        (n, 2P): the positions ``take`` names (``elmo_core.lstm.unpack``).
        ``plan``: the batch's rows (``plan``, on the device); None: planned here from ``lengths``,
        which reads them back from the device."""
        B, T, P = x.shape
        if plan is None:
            plan = self.plan(lengths.tolist(), T).to(x.device)
        win = self._window(plan.shape)
        n = win.xs.shape[1]  # T*R positions a window
        flat = torch.cat([x.reshape(B * T, P), x.new_zeros(1, P)])  # (B*T+1, P): the last row is padding's
        combined = x.new_empty(2, plan.windows * n + 1, P)  # (2, W*T*R+1, P)
        combined[:, -1] = 0
        win.rows.reset()
        win.weights.copy_(weights)
        for w in range(plan.windows):
            sources, keep_w = plan.window(w)
            torch.index_select(flat, 0, sources.reshape(-1), out=win.xs.view(-1, P))  # (2*T*R, P)
            win.keep.copy_(keep_w)
            combined[:, w * n : (w + 1) * n] = self._run(win)
        self.positions += plan.windows * n
        self.padded += plan.windows * n - plan.tokens
        return plan.unpack(combined, positions, keep, take)

    def warm(self, most_sentences: int | None = None) -> list[int]:
        """Capture a window of every row count a batch of at most ``most_sentences`` sentences may
        take (``RowShape.row_counts``), so that no request waits for a capture; the carried state
        is zeroed after. Returns the row counts held."""
        if self.capture:
            for rows in self.shape.row_counts(most_sentences):
                win = self._window(RowShape(rows, self.shape.steps))
                win.rows.reset()
                self._run(win)
                win.rows.reset()
        return sorted(self.windows)

    def _window(self, shape: RowShape) -> _Window:
        if shape.rows not in self.windows:
            rows = RowLstm(self.lstm, shape)
            cfg, dev, TR = self.lstm.stack.cfg, rows.h.device, shape.steps * shape.rows
            self.windows[shape.rows] = _Window(rows, torch.zeros(2, TR, cfg.projection_dim, device=dev),
                                               keep_buffer(shape, dev),
                                               torch.zeros(cfg.n_layers + 1, device=dev))
        return self.windows[shape.rows]

    def _run(self, win: _Window) -> torch.Tensor:
        """One window on the static buffers: replayed when captured, else run (and, the first
        time with ``capture``, captured). Returns the window's mix (2, T*R, P)."""
        if win.graph is not None:
            win.graph.replay()
            self.replays += 1
            return win.out
        if not self.capture:
            return win.rows.window(win.xs, win.keep, win.weights)
        return self._capture(win)

    def _capture(self, win: _Window) -> torch.Tensor:
        """Warm up on a side stream (as torch.cuda.graphs requires; the kernels compile here),
        then capture one window. The state is restored after the warm-up so that the captured
        window, replayed once, computes this window again from it."""
        saved = win.rows.h.clone(), win.rows.c.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            win.rows.window(win.xs, win.keep, win.weights)
        torch.cuda.current_stream().wait_stream(side)
        win.rows.h.copy_(saved[0])
        win.rows.c.copy_(saved[1])
        win.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(win.graph, capture_error_mode="thread_local"):  # other threads may use CUDA meanwhile
            win.out = win.rows.window(win.xs, win.keep, win.weights)  # (2, T*R, P), static
        win.graph.replay()  # capturing does not run the work
        self.captures += 1
        return win.out

    def memory_bytes(self) -> int:
        """Bytes of the static buffers and the carried states (each graph's private pool holds its
        intermediates besides: ``torch.cuda.memory_reserved`` reports the whole)."""
        tensors = [t for w in self.windows.values() for t in (w.xs, w.keep, w.weights, w.out, w.rows.h, w.rows.c)
                   if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
