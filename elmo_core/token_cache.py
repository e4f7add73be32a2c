"""A cache of token representations keyed by character ids, reused across batches.

The char-CNN is a pure function of a token's characters, so its output can be kept, like the
original's token-embedding dump (``dump_token_embeddings``), but filled on the fly. Inference
only; cleared whenever the encoder's parameters change.
"""
from __future__ import annotations

from typing import Callable

import torch


class TokenCache:
    """Shape: ``lookup(ids (U, C), encode) -> (U, P)`` for U distinct tokens."""

    def __init__(self, max_tokens: int = 50_000) -> None:
        self.max_tokens = max_tokens
        self.index: dict[bytes, int] = {}
        self.store: torch.Tensor | None = None  # (capacity, P)
        self.key: tuple | None = None
        self.filled = 0  # rows of ``store`` in use
        self.hits = self.misses = 0

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
        keys = [row.tobytes() for row in ids.to(torch.int32).cpu().numpy()]
        self.store = vectors.new_empty(len(keys) + self.max_tokens, vectors.shape[1])  # (V + capacity, P)
        self.store[: len(keys)] = vectors
        self.index = dict(zip(keys, range(len(keys))))
        self.filled = len(keys)

    def _check_version(self, params: list[torch.Tensor]) -> None:
        key = tuple((p._version, p.data_ptr()) for p in params)
        if key != self.key:
            self.clear()
            self.key = key

    def lookup(self, ids: torch.Tensor, encode: Callable[[torch.Tensor], torch.Tensor],
               params: list[torch.Tensor]) -> torch.Tensor:
        self._check_version(params)
        raw = ids.to(torch.int32).cpu().numpy()
        keys = [row.tobytes() for row in raw]
        where = [self.index.get(k, -1) for k in keys]
        miss = [i for i, w in enumerate(where) if w < 0]
        self.hits += len(keys) - len(miss)
        self.misses += len(miss)
        fresh = encode(ids[miss]) if miss else None  # (M, P)
        if self.store is None:  # an empty cache: the first call misses every token
            self.store = fresh.new_empty(self.max_tokens, fresh.shape[1])  # (capacity, P)
        out = self.store.new_empty(len(keys), self.store.shape[1])  # (U, P)
        hit = [i for i, w in enumerate(where) if w >= 0]
        if hit:
            out[hit] = self.store[[where[i] for i in hit]]
        if miss:
            out[miss] = fresh
            self._insert([keys[i] for i in miss], fresh)
        return out

    def _insert(self, keys: list[bytes], values: torch.Tensor) -> None:
        room = self.store.shape[0] - self.filled
        if room <= 0:
            return
        keys, values = keys[:room], values[:room]
        start = self.filled
        self.store[start : start + len(keys)] = values
        self.index.update((k, start + i) for i, k in enumerate(keys))
        self.filled += len(keys)
