"""The biLM's inference fast path: ``elmo_core.bilm.FastPath`` for the torch backend.

One object per backend, plugged into its model with ``BiLM.use_fast_path``; the model runs it only
while autograd is off, so training never sees it. What each step adds to the reference:

- ``encode``: a ``TokenCache`` of char-CNN outputs across batches (and a token-embedding file's
  vectors preloaded into it); the char-CNN under ``torch.autocast`` in bf16 / fp16, and in fp32
  on packed oneDNN weights where the LSTM's products are (``inference.char_products``).
- ``run_layer``: ``inference.fast_lstm.FastLstm`` (in-place steps, chunked input products,
  packed oneDNN weights, reduced-precision weight copies), or with ``fused`` (the default on
  CUDA) ``inference.fused_lstm.FusedLstm`` (each step two products and two compiled kernels).
- ``combine``: the layers mixed while packed, each layer by ``run_layer``; with ``cuda_graphs``
  the sentences laid in rows of one static shape and replayed as one CUDA graph
  (``inference.cuda_graphs.RowGraphs`` over ``inference.row_lstm``; fused steps).
- ``embed``: inside ``batch(plan)``, the LSTM's input from the host's plan of the batch
  (``prepare``: ``inference.host_batch``), so that neither it nor ``combine`` reads anything back
  from the device; outside, None (the reference's steps, with ``encode``).

Each is tested against the reference model: tests/inference/test_fast_path.py, and every option
in tests/core/test_bilm.py, every precision in tests/inference/test_precision.py.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

from elmo_core.bilm import BiLM
from elmo_core.char_encoder import CharProducts
from elmo_core.fused_cell import FusedCell
from elmo_core.host_to_device import to_device
from elmo_core.kinds import Precision
from elmo_core.lstm import Packing, TokenRows, dense

from .char_products import PackedCharProducts
from .cuda_graphs import RowGraphs
from .fast_lstm import PACKED_MIN_WEIGHTS, FastLstm
from .fused_lstm import FusedLstm
from .host_batch import HostBatch, plan_batch
from .precision import tf32_products, torch_precision
from .row_shape import RowShape
from .token_cache import TokenCache


class FastInference:
    """``precision``: the products' precision (``inference.precision``; runs go inside ``running()``).
    ``token_cache``: None for none. ``layout`` (``inference.layout``): ``packed``, ``fused`` or
    ``rows``; None: the device's own (``rows`` on CUDA, ``packed`` on a CPU) unless ``fused`` or
    ``cuda_graphs`` say otherwise. ``fused``: fused steps (``kernels``: their kernels, see
    ``FusedLstm``; the ``fused`` layout compiles them and, on a CPU, packs the products' weights).
    ``cuda_graphs``: ``combine`` over static rows, replayed as one CUDA graph (a CUDA device;
    ``capture=False`` runs the same windows eagerly; always fused); ``rows``: the most rows and the
    steps of a window. ``directions``: on a CPU's packed weights, each direction on a thread of its
    own (``inference.directions``; False: never)."""

    def __init__(self, model: BiLM, precision: str | Precision = "fp32", token_cache: TokenCache | None = None,
                 cuda_graphs: bool = False, capture: bool = True, chunk_rows: int | None = None,
                 packed_min_weights: int = PACKED_MIN_WEIGHTS, fused: bool | None = None,
                 rows: RowShape = RowShape(), kernels: FusedCell | None = None, layout: str | None = None,
                 directions: bool = True) -> None:
        self.kind = precision if isinstance(precision, Precision) else torch_precision(precision)
        self.model, self.precision, self.token_cache = model, self.kind.name, token_cache
        self.dtype = self.kind.torch
        on_cpu, asked = model.lstm.w_input.device.type == "cpu", layout is not None
        if layout is None:
            layout = "rows" if cuda_graphs else "fused" if (not on_cpu if fused is None else fused) else "packed"
        self.layout = layout
        if layout == "packed":
            self.lstm: FastLstm = FastLstm(model.lstm, self.dtype, chunk_rows, packed_min_weights, directions)
        elif asked and on_cpu and kernels is None:  # the CPU's fused layout: compiled kernels, packed weights
            self.lstm = FusedLstm(model.lstm, self.dtype, chunk_rows, FusedCell.compiled(), packed=True,
                                  directions=directions)
        else:
            self.lstm = FusedLstm(model.lstm, self.dtype, chunk_rows, kernels, directions=directions)
        self.graphs = RowGraphs(self.lstm, rows, capture=capture) if layout == "rows" else None
        self._boundary_ids = model.tokenizer.boundary_ids()  # (2, W) <S> and </S>, host ids
        self._host: HostBatch | None = None  # the plan of the batch running inside ``batch``
        self._packed_char = PackedCharProducts(model.encoder)

    def prepare(self, char_ids: np.ndarray) -> HostBatch:
        """A batch's host work (``inference.host_batch.plan_batch``), before its device work; plans
        run (``batch``) in the order they were made. Shape: char_ids (B, T, W)."""
        return plan_batch(char_ids, self._boundary_ids, self.model.encoder, self.token_cache,
                          None if self.graphs is None else self.graphs.plan)

    @contextlib.contextmanager
    def batch(self, plan: HostBatch) -> Iterator[None]:
        """The model's runs inside take the batch from ``plan`` (``embed``, ``combine``); a run that
        fails abandons it."""
        self._host = plan
        try:
            yield
        except BaseException:
            self.abandon(plan)
            raise
        finally:
            self._host = None

    def abandon(self, plan: HostBatch | None) -> None:
        """A plan whose batch will not run (it failed, or a job stopped before it): the token cache
        forgets the rows it gave, and any given after."""
        if plan is not None and plan.mark is not None and self.token_cache is not None:
            self.token_cache.rollback(plan.mark)

    def embed(self, char_ids: torch.Tensor) -> tuple[TokenRows, torch.Tensor, torch.Tensor] | None:
        """The LSTM's input from the plan of the batch running (``batch``); None outside one (the
        reference's steps run). Only ``char_ids``' shape is read. Shape: (B, T, W) -> x (B, T+2, P)
        (the tokens, <S> first, </S> after each row's last) as rows of [distinct tokens; zero],
        mask (B, T), lengths (B,)."""
        plan = self._host
        if plan is None or tuple(char_ids.shape[:2]) != plan.shape:
            return None
        dev = self.model.lstm.w_input.device
        T, P = plan.shape[1], self.model.config.lstm.projection_dim
        lengths = to_device(plan.lengths, dev)  # (B,)
        mask = torch.arange(T, device=dev)[None, :] < lengths[:, None]  # (B, T)
        fresh = (self._char_cnn(to_device(plan.chars, dev), plan.widths) if plan.widths
                 else torch.zeros(0, P, device=dev))  # (M, P) the misses, in the char-CNN's order
        miss = to_device(plan.miss, dev)
        if plan.cache is not None:
            where, kept, slots = (to_device(t, dev) for t in plan.cache)
            distinct = self.token_cache.fill(where, miss, kept, slots, fresh)  # (U, P)
        else:
            distinct = fresh.new_empty(plan.distinct, P).index_copy_(0, miss, fresh)  # (U, P)
        table = torch.cat([distinct, distinct.new_zeros(1, P)])  # (U+1, P): the last row is padding's
        return TokenRows(table, to_device(plan.index, dev)), mask, lengths

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

    def _char_cnn(self, char_ids: torch.Tensor, widths: list[int] | None = None) -> torch.Tensor:
        """The char-CNN, under autocast in bf16 / fp16; fp32 out. ``widths``: the tokens are in
        ``CharEncoder.plan_chunks``' order, these its chunks' widths. Shape: (N, C) -> (N, P)."""
        encoder, products = self.model.encoder, self._char_products()
        if widths is None:
            run = lambda ids: encoder(ids, products)  # noqa: E731
        else:
            run = lambda ids: encoder.forward_planned(ids, widths, products)  # noqa: E731
        if self.dtype == torch.float32:
            return run(char_ids)
        with torch.autocast(char_ids.device.type, dtype=self.dtype):
            return run(char_ids).float()

    def _char_products(self) -> CharProducts | None:
        """The char-CNN's products on packed oneDNN weights where the LSTM's run on them in fp32
        (``inference.char_products``); else None: the encoder's own."""
        if self.dtype != torch.float32 or not self.lstm.per_direction_products():
            return None
        return self._packed_char()

    def run_layer(self, layer: int, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Shape: xs (2, N, P), h (2, B, P), c (2, B, C) -> out (2, N, P), h, c."""
        return self.lstm.run_layer(layer, xs, pack, h, c)

    def combine(self, x: torch.Tensor | TokenRows, lengths: torch.Tensor, weights: torch.Tensor,
                positions: slice = slice(None), keep: torch.Tensor | None = None,
                take: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: x (B, T, P) (or its ``TokenRows``), lengths (B,), weights (L+1,) -> (B, T', 2P), or
        (n, 2P): the positions ``take`` names (``BiLstmStack.forward_combined``)."""
        if self.graphs is not None:
            plan = self._host
            held = plan is not None and plan.rows is not None and plan.shape == (x.shape[0], x.shape[1] - 2)
            return self.graphs(dense(x), lengths, weights, positions, keep, plan.rows.to(x.device) if held else None,
                               take)
        return self.model.lstm.forward_combined(x, lengths, weights, positions, keep, self.lstm.run_layer, take)
