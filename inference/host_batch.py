"""A batch's host work, done before its device work (on CUDA while the previous batch runs:
``inference.engine``). ``plan_batch`` reads the character ids once, on the host, and finds there
everything the device would otherwise be asked for, so that a batch on CUDA makes the host wait
for nothing but its result:

- the rows' lengths, checked left-aligned (``BiLM._mask``, on host tensors);
- the distinct tokens with <S> and </S> among them (``unique_rows`` on the host) and, for each
  position of the LSTM's input (B, T+2), its row of [distinct tokens; zero]: one gather on the
  device places the tokens, both boundaries and the padding;
- the token cache's plan (``TokenCache.plan``): the distinct tokens it holds, the rows it gives
  the others;
- the tokens the char-CNN runs (the cache's misses) in its order, each chunk's trimmed width
  (``CharEncoder.plan_chunks``, for ``forward_planned``);
- the rows layout's plan (``RowGraphs.plan``), where the fast path has one.

``FastInference.embed`` and ``combine`` do the device's half; both against the reference model in
tests/inference/test_host_waits.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from elmo_core.bilm import BiLM, unique_rows
from elmo_core.char_encoder import CharEncoder

from .row_lstm import RowPlan
from .token_cache import TokenCache, token_keys


@dataclass
class HostBatch:
    """Host tensors. Shape: lengths (B,); index (B, T+2) each input position's row of [distinct
    tokens (U); zero]; chars (M, W) the distinct tokens the char-CNN runs, in its order, ``widths``
    each chunk's width; miss (M,) which distinct tokens they are; cache: the token cache's
    (where (U,), kept (K,), slots (K,)) (``TokenCache.fill``), None without a cache; ``mark``: the
    cache's rows before this plan (``TokenCache.rollback``)."""

    lengths: torch.Tensor
    index: torch.Tensor
    distinct: int
    chars: torch.Tensor
    widths: list[int]
    miss: torch.Tensor
    cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    rows: RowPlan | None
    mark: int | None

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T) of the batch's char ids."""
        return self.index.shape[0], self.index.shape[1] - 2


def plan_batch(char_ids: np.ndarray, boundary_ids: np.ndarray, encoder: CharEncoder, cache: TokenCache | None,
               rows_of: Callable[[list[int], int], RowPlan] | None = None) -> HostBatch:
    """Everything the host can say of a batch (module doc). ``rows_of(lengths, t_in)``: the rows
    layout's planner, or None. Shape: char_ids (B, T, W), boundary_ids (2, W)."""
    ids = np.ascontiguousarray(char_ids)  # planned in numpy: its calls cost a batch's small arrays less than torch's
    B, T, W = ids.shape
    mask, lengths = BiLM._mask(ids)  # (B, T), (B,); refuses rows that are not left-aligned
    real = ids.reshape(B * T, W)[mask.reshape(-1)]  # (N, W)
    uniq_np, inverse = unique_rows(np.concatenate([real, boundary_ids.astype(ids.dtype)]))  # (U, W), (N+2,)
    U, uniq = uniq_np.shape[0], torch.from_numpy(uniq_np)
    index = np.full((B, T + 2), U, dtype=np.int64)  # (B, T+2): the zero row, then the tokens placed
    index[:, 0] = inverse[-2]
    index[:, 1 : T + 1][mask] = inverse[:-2]
    index[np.arange(B), lengths + 1] = inverse[-1]
    miss, planned, mark = torch.arange(U), None, None
    if cache is not None:
        mark = cache.filled
        where, miss, slots = cache.plan(token_keys(uniq), list(encoder.parameters()))
    order, widths = encoder.plan_chunks(uniq[miss])
    if cache is not None:
        slots = slots[order]
        kept = torch.nonzero(slots >= 0).squeeze(1)  # (K,) the misses the cache keeps, in the char-CNN's order
        planned = (where, kept, slots[kept])
    rows = None if rows_of is None else rows_of((lengths + 2).tolist(), T + 2)
    return HostBatch(torch.from_numpy(lengths.astype(np.int64)), torch.from_numpy(index), U, uniq[miss][order], widths,
                     miss[order], planned, rows, mark)
