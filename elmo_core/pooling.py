"""Sentence vectors: a sentence's token vectors pooled into one, masked so padding never enters.

``mean`` sums the real tokens and divides by their count; ``max`` takes each dimension's
largest value over the real tokens. A sentence with no token has no vector (NaN rows here; the
callers turn them into None / null). ``pool_tokens`` is the reference on padded batches;
``pool_ragged`` pools the ragged rows every door assembles (``Embedder.embed_sentences``,
``elmo embed``'s predictor) without padding them, and is tested against it.
"""
from __future__ import annotations

import numpy as np
import torch

from .errors import InputError
from .names import POOLS


def pool_tokens(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Shape: x (B, T, ...) token vectors (any trailing dims, e.g. (L+1, D)), mask (B, T) bool
    -> (B, ...) in float32 or wider; NaN where a row has no token."""
    if how not in POOLS:
        raise InputError(f"pool must be one of {POOLS}, got {how!r}")
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    m = mask.reshape(mask.shape + (1,) * (x.dim() - 2))  # (B, T, 1, ...)
    if how == "mean":
        count = mask.sum(dim=1).to(x.dtype).reshape((-1,) + (1,) * (x.dim() - 2))  # (B, 1, ...)
        return torch.where(m, x, 0).sum(dim=1) / count  # 0 / 0 = NaN for an empty row
    pooled = torch.where(m, x, float("-inf")).amax(dim=1)  # (B, ...)
    return torch.where(mask.any(dim=1).reshape((-1,) + (1,) * (x.dim() - 2)), pooled, float("nan"))


def pool_ragged(vectors: np.ndarray, lengths: np.ndarray, how: str) -> np.ndarray:
    """Consecutive runs of token vectors, one run per row, each pooled (``reduceat`` over the
    row offsets). Shape: vectors (N, ...) float32, lengths (R,) (<= 0: a row with no token; the
    lengths sum to N) -> (R, ...) float32, NaN where a row has no token."""
    if how not in POOLS:
        raise InputError(f"pool must be one of {POOLS}, got {how!r}")
    n = np.maximum(np.asarray(lengths), 0)  # (R,)
    starts = (np.cumsum(n) - n)[n > 0]  # (R',) of the rows that have tokens
    rows = np.full((len(n),) + vectors.shape[1:], np.nan, np.float32)  # (R, ...)
    if starts.size:
        if how == "mean":
            rows[n > 0] = np.add.reduceat(vectors, starts, axis=0) / n[n > 0].reshape((-1,) + (1,) * (vectors.ndim - 1))
        else:
            rows[n > 0] = np.maximum.reduceat(vectors, starts, axis=0)
    return rows
