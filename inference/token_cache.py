"""A cache of token representations keyed by character ids, reused across batches.

The char-CNN is a pure function of a token's characters, so its output can be kept, like the
original's token-embedding dump (``dump_token_embeddings``), but filled on the fly. Inference
only; cleared whenever the encoder's parameters change. ``compute_token_embeddings`` makes a
token-embedding file's vectors (``elmo dump-tokens``); ``preload_token_cache`` puts a file's into a
cache after checking them against the model (the file format: ``formats.token_embeddings``).
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np
import torch

from elmo_core.bilm import BiLM
from formats.token_embeddings import TokenEmbeddings, TokenEmbeddingsError

from .packed_gemm import weights_key


def token_keys(ids: torch.Tensor) -> list[bytes]:
    """Each token's cache key: its character ids as int32 bytes, all rows in one view (no per-row
    call). Shape: ids (U, C) -> U keys."""
    rows = np.ascontiguousarray(ids.to(torch.int32).cpu().numpy())  # (U, C)
    return rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel().tolist()


class TokenCache:
    """Shape: ``lookup(ids (U, C), encode) -> (U, P)`` for U distinct tokens."""

    def __init__(self, max_tokens: int = 50_000) -> None:
        self.max_tokens = max_tokens
        self.index: dict[bytes, int] = {}
        self.store: torch.Tensor | None = None  # (capacity, P)
        self.key: tuple | None = None
        self.filled = 0  # rows of ``store`` in use
        self.hits = self.misses = 0
        self._planning = threading.Lock()  # ``plan`` (the engine's thread) against ``rollback``

    def clear(self) -> None:
        self.index.clear()
        self.store = None
        self.filled = 0

    def preload(self, ids: torch.Tensor, vectors: torch.Tensor, params: list[torch.Tensor]) -> None:
        """Hold ``vectors`` for the tokens ``ids`` (a token-embedding file), besides the
        ``max_tokens`` filled on the fly; dropped like the rest if the parameters change.

        Shape: ids (V, C), vectors (V, P).
        """
        self._check_version(params)
        self.clear()
        keys = token_keys(ids)
        self.store = vectors.new_empty(len(keys) + self.max_tokens, vectors.shape[1])  # (V + capacity, P)
        self.store[: len(keys)] = vectors
        self.index = dict(zip(keys, range(len(keys))))
        self.filled = len(keys)

    def _check_version(self, params: list[torch.Tensor]) -> None:
        key = weights_key(params)
        if key != self.key:
            self.clear()
            self.key = key

    def lookup(self, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor],
               params: list[torch.Tensor]) -> torch.Tensor:
        """``plan`` then ``fill`` in one call: the misses run through ``encode``, the rest come
        from ``store``. Shape: ids (U, C) -> (U, P)."""
        mark = self.filled
        where, miss, slots = (t.to(ids.device) for t in self.plan(token_keys(ids), params))  # (U,), (M,), (M,)
        if miss.numel() == 0 and self.store is not None:
            return self.store.index_select(0, where)  # (U, P)
        try:
            fresh = encode(ids.index_select(0, miss))  # (M, P)
        except BaseException:
            self.rollback(mark)  # the rows given to the misses were never filled
            raise
        kept = torch.nonzero(slots >= 0).squeeze(1)  # (K,)
        return self.fill(where, miss, kept, slots.index_select(0, kept), fresh)

    def plan(self, keys: list[bytes], params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The host's half of a lookup, before anything runs on the device: each key's row of
        ``store`` (-1: a miss), the misses, and the row each miss is given (-1: no room left).
        The device's half, ``fill``, runs for these plans in the order they were made.

        Shape: U keys -> where (U,), miss (M,) indices into keys, slots (M,); int64 host tensors."""
        with self._planning:
            self._check_version(params)
            where = torch.tensor([self.index.get(k, -1) for k in keys], dtype=torch.long)  # (U,)
            miss = torch.nonzero(where < 0).squeeze(1)  # (M,)
            self.hits += len(keys) - len(miss)
            self.misses += len(miss)
            capacity = self.max_tokens if self.store is None else self.store.shape[0]
            given = min(len(miss), max(capacity - self.filled, 0))
            slots = torch.full((len(miss),), -1, dtype=torch.long)
            slots[:given] = torch.arange(self.filled, self.filled + given)
            self.index.update((keys[i], self.filled + n) for n, i in enumerate(miss[:given].tolist()))
            self.filled += given
        return where, miss, slots

    def rollback(self, mark: int) -> None:
        """Forget the rows given at or after ``mark`` (``filled`` before a ``plan`` whose ``fill``
        will not run: its batch failed, or a job stopped before it)."""
        with self._planning:
            if mark < self.filled:
                self.index = {k: v for k, v in self.index.items() if v < mark}
                self.filled = mark

    def fill(self, where: torch.Tensor, miss: torch.Tensor, kept: torch.Tensor, slots: torch.Tensor,
             fresh: torch.Tensor) -> torch.Tensor:
        """The device's half of a lookup (``plan``'s tensors on the device): ``fresh`` holds the
        misses' vectors in the order of ``miss``; those at ``kept`` are stored at ``slots``.

        Shape: where (U,), miss (M,), kept (K,), slots (K,), fresh (M, P) -> (U, P)."""
        if self.store is None:
            self.store = fresh.new_zeros(self.max_tokens, fresh.shape[1])  # (capacity, P)
        fresh = fresh.to(self.store.dtype)
        out = self.store.index_select(0, where.clamp(min=0))  # (U, P): a miss's row is replaced next
        out.index_copy_(0, miss, fresh)
        self.store.index_copy_(0, slots, fresh.index_select(0, kept))
        return out


def compute_token_embeddings(model: BiLM, tokens: Sequence[str], chunk: int = 4096) -> np.ndarray:
    """Each token's char-CNN representation (highway and projection included), as the model
    computes it inside a sentence.

    Shape: V tokens -> (V, P) float32.
    """
    ids = model.tokenizer.token_ids(tokens)  # (V, W)
    device = next(model.parameters()).device
    out = np.empty((len(tokens), model.config.lstm.projection_dim), dtype=np.float32)  # (V, P)
    with torch.inference_mode():
        for start in range(0, len(tokens), chunk):
            part = torch.from_numpy(ids[start : start + chunk]).to(device)  # (n, C)
            out[start : start + part.shape[0]] = model.encoder(part).float().cpu().numpy()  # (n, P)
    return out


def preload_token_cache(model: BiLM, table: TokenEmbeddings, cache: TokenCache, check_rows: int = 64) -> None:
    """Put a file's vectors into ``cache`` so that its tokens skip the char-CNN, after checking
    that this model computes the same vectors for a spread of its rows (atol = rtol = 1e-4): a file
    dumped from another model is an error, not silently wrong vectors."""
    ids = torch.from_numpy(model.tokenizer.token_ids(table.tokens))  # (V, W)
    vectors = torch.from_numpy(table.vectors)  # (V, P)
    P = model.config.lstm.projection_dim
    if vectors.shape[1] != P:
        raise TokenEmbeddingsError(f"token embeddings are {vectors.shape[1]}-wide but the model's projection is {P}; "
                                   f"dump them from this model (elmo dump-tokens)")
    device = next(model.parameters()).device
    rows = torch.linspace(0, len(table.tokens) - 1, min(check_rows, len(table.tokens))).long().unique()  # (k,)
    with torch.inference_mode():
        fresh = model.encoder(ids[rows].to(device)).float().cpu()  # (k, P)
    err = (fresh - vectors[rows]).abs() - 1e-4 * vectors[rows].abs()  # (k, P)
    if err.max() > 1e-4:
        k = int(rows[err.amax(dim=1).argmax()])
        raise TokenEmbeddingsError(f"token embeddings do not match this model's char-CNN (token {table.tokens[k]!r}, "
                                   f"row {k}: max |diff| {float((fresh - vectors[rows]).abs().max()):.3g}); "
                                   f"dump them from this model (elmo dump-tokens)")
    cache.preload(ids, vectors.to(device, next(model.parameters()).dtype), list(model.encoder.parameters()))
