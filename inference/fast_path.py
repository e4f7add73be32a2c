"""The biLM's inference fast path: ``elmo_core.bilm.FastPath`` for the torch backend.

One object per backend, plugged into its model with ``BiLM.use_fast_path``; the model runs it only
while autograd is off, so training never sees it. What each step adds to the reference:

- ``encode``: a ``TokenCache`` of char-CNN outputs across batches (and a token-embedding file's
  vectors preloaded into it); the char-CNN under ``torch.autocast`` in bf16 / fp16.
- ``run_layer``: ``inference.fast_lstm.FastLstm`` (in-place steps, chunked input products,
  packed oneDNN weights, reduced-precision weight copies), or with ``fused`` (the default on
  CUDA) ``inference.fused_lstm.FusedLstm`` (each step two products and two compiled kernels).
- ``combine``: the layers mixed while packed, each layer by ``run_layer``; with ``cuda_graphs``
  the sentences laid in rows of one static shape and replayed as one CUDA graph
  (``inference.cuda_graphs.RowGraphs`` over ``inference.row_lstm``; fused steps).

Each is tested against the reference model: tests/inference/test_fast_path.py, and every option
in tests/core/test_bilm.py, every precision in tests/core/test_precision.py.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from elmo_core.bilm import BiLM
from elmo_core.fused_cell import FusedCell
from elmo_core.kinds import Precision
from elmo_core.lstm import Packing

from .cuda_graphs import RowGraphs
from .fast_lstm import INPUT_CHUNK_ROWS, PACKED_MIN_WEIGHTS, FastLstm
from .fused_lstm import FusedLstm
from .precision import tf32_products, torch_precision
from .row_lstm import RowShape
from .token_cache import TokenCache


class FastInference:
    """``precision``: the products' precision (``inference.precision``; runs go inside ``running()``).
    ``token_cache``: None for none. ``layout`` (``inference.layout``): ``packed``, ``fused`` or
    ``rows``; None: the device's own (``rows`` on CUDA, ``packed`` on a CPU) unless ``fused`` or
    ``cuda_graphs`` say otherwise. ``fused``: fused steps (``kernels``: their kernels, see
    ``FusedLstm``; the ``fused`` layout compiles them and, on a CPU, packs the products' weights).
    ``cuda_graphs``: ``combine`` over static rows, replayed as one CUDA graph (a CUDA device;
    ``capture=False`` runs the same windows eagerly; always fused); ``rows``: the most rows and the
    steps of a window."""

    def __init__(self, model: BiLM, precision: str | Precision = "fp32", token_cache: TokenCache | None = None,
                 cuda_graphs: bool = False, capture: bool = True, chunk_rows: int = INPUT_CHUNK_ROWS,
                 packed_min_weights: int = PACKED_MIN_WEIGHTS, fused: bool | None = None,
                 rows: RowShape = RowShape(), kernels: FusedCell | None = None, layout: str | None = None) -> None:
        self.kind = torch_precision(precision)
        self.model, self.precision, self.token_cache = model, self.kind.name, token_cache
        self.dtype = self.kind.torch
        on_cpu, asked = model.lstm.w_input.device.type == "cpu", layout is not None
        if layout is None:
            layout = "rows" if cuda_graphs else "fused" if (not on_cpu if fused is None else fused) else "packed"
        self.layout = layout
        if layout == "packed":
            self.lstm: FastLstm = FastLstm(model.lstm, self.dtype, chunk_rows, packed_min_weights)
        elif asked and on_cpu and kernels is None:  # the CPU's fused layout: compiled kernels, packed weights
            self.lstm = FusedLstm(model.lstm, self.dtype, chunk_rows, FusedCell.compiled(), packed=True)
        else:
            self.lstm = FusedLstm(model.lstm, self.dtype, chunk_rows, kernels)
        self.graphs = RowGraphs(self.lstm, rows, capture=capture) if layout == "rows" else None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Where the model runs on this path: no autograd (so the model takes it), tf32 products for tf32,
        the model's GPU the current one (``cuda:N``: its streams, graphs and events), whichever thread runs."""
        device = self.model.lstm.w_input.device
        on_gpu = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), tf32_products(self.kind.gpu_rounds), on_gpu:
            yield

    def encode(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Shape: (U, C) distinct tokens -> (U, P) fp32."""
        if self.token_cache is None:
            return self._char_cnn(char_ids)
        return self.token_cache.lookup(char_ids, self._char_cnn, list(self.model.encoder.parameters()))

    def _char_cnn(self, char_ids: torch.Tensor) -> torch.Tensor:
        """The char-CNN, under autocast in bf16 / fp16; fp32 out. Shape: (N, C) -> (N, P)."""
        if self.dtype == torch.float32:
            return self.model.encoder(char_ids)
        with torch.autocast(char_ids.device.type, dtype=self.dtype):
            return self.model.encoder(char_ids).float()

    def run_layer(self, layer: int, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c."""
        return self.lstm.run_layer(layer, xs, pack, h, c)

    def combine(self, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor, positions: slice = slice(None),
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: x (B, T, P), lengths (B,), weights (L+1,) -> (B, T', 2P)."""
        if self.graphs is not None:
            return self.graphs(x, lengths, weights, positions, keep)
        return self.model.lstm.forward_combined(x, lengths, weights, positions, keep, self.lstm.run_layer)
