"""The biLM's recurrence replayed as CUDA graphs: no per-step kernel launches from Python.

Eager, a batch's recurrence launches ~10 small kernels per time step, layer and direction, and on
a GPU those launches, not the products, bound it. ``GraphedStack`` captures the whole stateless
stack (every layer, both directions, the layer mix) once per bucket of (rows, steps) and replays
it. A graph needs static shapes, so every row of a bucket runs every step
(``Packing(..., every_step=True)``): each row's padding comes after its real steps in both
reading orders, so it never reaches a kept vector. It costs the padding's compute, which the
job's length sorting keeps small, and the rows and steps are rounded up to buckets
(``bucket_size``: at most ~1/8 more) so that few graphs serve every batch; at most
``max_graphs`` are kept, least recently used dropped.

``GraphedStack(stack, capture=False)`` runs the same bucketed path eagerly (any device): that is
how it is tested on a CPU against ``BiLstmStack.forward_combined``; capture and replay are tested
on a GPU (tests/gpu).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from elmo_core.lstm import BiLstmStack, Packing, RunLayer


def bucket_size(n: int, minimum: int = 8) -> int:
    """``n`` rounded up to a multiple of max(minimum, its power of two / 8): at most ~12.5 % more."""
    if n <= minimum:
        return minimum
    step = max(minimum, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


@dataclass
class _Graph:
    """One bucket's static buffers and, when captured, its graph.

    Shape: xs (2, N, P) with N = steps x rows, weights (L+1,), combined (2, N+1, P).
    """

    pack: Packing
    xs: torch.Tensor
    weights: torch.Tensor
    combined: torch.Tensor | None = None
    graph: "torch.cuda.CUDAGraph | None" = None


class GraphedStack:
    """``BiLstmStack.forward_combined`` (same signature, same vectors) over bucketed, padded
    batches, each bucket's recurrence a CUDA graph replayed (``capture=True``, CUDA only).

    ``run_layer``: how each layer runs (``BiLstmStack.run_packed``; inference passes
    ``FastLstm.run_layer``). ``max_graphs``: graphs kept; each holds its buffers (about
    12 x steps x rows x P floats plus the input products' chunk, see ``memory_bytes``).
    """

    def __init__(self, stack: BiLstmStack, run_layer: RunLayer | None = None, capture: bool = True,
                 max_graphs: int = 16, min_rows: int = 8, min_steps: int = 8) -> None:
        self.stack, self.run_layer, self.capture, self.max_graphs = stack, run_layer, capture, max_graphs
        self.min_rows, self.min_steps = min_rows, min_steps
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.captures = self.replays = 0

    def __call__(self, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor,
                 positions: slice = slice(None), keep: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: x (B, T, P) zero at padding, lengths (B,), weights (L+1,) -> (B, T', 2P)."""
        B, T, _ = x.shape
        rows, steps = bucket_size(B, self.min_rows), bucket_size(T, self.min_steps)
        kept = range(T)[positions]  # the positions wanted, as indices into the unpadded T
        positions = slice(kept.start, kept.stop, kept.step)
        if keep is None:  # padding runs in this path: its positions are masked explicitly
            keep = (torch.arange(T, device=x.device)[None, :] < lengths[:, None])[:, positions]  # (B, T')
        keep = torch.cat([keep, keep.new_zeros(rows - B, keep.shape[1])])  # (rows, T')
        x = F.pad(x, (0, 0, 0, steps - T, 0, rows - B))  # (rows, steps, P)
        pack = Packing(torch.cat([lengths, lengths.new_zeros(rows - B)]), steps, every_step=True)
        g = self._graph(rows, steps, x.dtype)
        g.xs.copy_(pack.pack(x))  # (2, N, P)
        g.weights.copy_(weights)
        if g.graph is not None:
            g.graph.replay()
            self.replays += 1
        else:
            g.combined = self.stack.combine_packed(g.xs, g.pack, g.weights, self.run_layer)  # (2, N+1, P)
        return pack.unpack(g.combined, positions, keep)[:B]  # (B, T', 2P)

    def _graph(self, rows: int, steps: int, dtype: torch.dtype) -> _Graph:
        key = (rows, steps)
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        while len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)
        device = self.stack.w_input.device
        L, P = self.stack.cfg.n_layers, self.stack.cfg.projection_dim
        g = _Graph(Packing.full(rows, steps, device), torch.zeros(2, rows * steps, P, dtype=dtype, device=device),
                   torch.zeros(L + 1, dtype=dtype, device=device))
        if self.capture:
            self._capture(g)
        self.graphs[key] = g
        return g

    def _capture(self, g: _Graph) -> None:
        """Warm up on a side stream (as torch.cuda.graphs requires), then capture ``combine_packed``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.stack.combine_packed(g.xs, g.pack, g.weights, self.run_layer)
        torch.cuda.current_stream().wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, capture_error_mode="thread_local"):  # other threads may use CUDA meanwhile
            g.combined = self.stack.combine_packed(g.xs, g.pack, g.weights, self.run_layer)  # (2, N+1, P), static
        self.captures += 1

    def memory_bytes(self) -> int:
        """Bytes the kept buckets' input and output buffers hold (the graphs' private pools hold
        the intermediates besides: ``torch.cuda.memory_reserved`` reports the whole)."""
        return sum(g.xs.numel() * g.xs.element_size() + (g.combined.numel() * g.combined.element_size()
                                                           if g.combined is not None else 0)
                   for g in self.graphs.values())
