"""The user-facing API: sentences in, ELMo vectors out, whatever the backend."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from elmo_core import POOLS, pool_tokens
from elmo_core.chars import check_sentences
from elmo_core.errors import InputError

from .backends import Backend
from .outputs import check_output, layer_weights, reduce_layers
from .registry import open_backend


class Embedder:
    """Embeds tokenized sentences with a backend.

    Stateless backends see length-sorted batches (less padding) and results come back in input
    order; a stateful backend sees the sentences in the order given, ``batch_size`` rows a call.
    """

    def __init__(self, backend: Backend, batch_size: int = 64) -> None:
        self.backend = backend
        self.batch_size = batch_size
        self.config = backend.config

    @classmethod
    def open(cls, model: str | Path, backend: str = "torch", batch_size: int = 64, **options: object) -> "Embedder":
        """Any backend of the registry (see ``inference.registry.open_backend`` for ``options``)."""
        return cls(open_backend(model, backend, **options), batch_size)  # type: ignore[arg-type]

    @classmethod
    def from_files(cls, options: str | Path, weights: str | Path | None = None, backend: str = "torch",
                   stateful: bool = False, batch_size: int = 64, threads: int | None = None,
                   device: str = "cpu") -> "Embedder":
        """Published ELMo files (options.json + weights .hdf5), or a model directory as ``options``.

        ``device``: where the torch backend runs ('cpu', 'cuda', 'cuda:1', ...).
        """
        if backend != "torch":
            raise InputError(f"from_files builds the torch backend; for {backend!r} use its export directory "
                             f"(Embedder.from_onnx / from_tensorrt)")
        return cls.open(options, "torch", batch_size, weights=weights, stateful=stateful, threads=threads,
                        device=device)

    @classmethod
    def from_onnx(cls, export_dir: str | Path, providers: Sequence[str] | None = None, threads: int | None = None,
                  batch_size: int = 64, **kw: object) -> "Embedder":
        """An `elmo export onnx` directory on ONNX Runtime (see inference.onnx_backend.OnnxBackend);
        ``providers`` default to the CPU's."""
        return cls.open(export_dir, "onnx", batch_size, providers=providers, threads=threads, **kw)

    @classmethod
    def from_tensorrt(cls, engine_dir: str | Path, batch_size: int = 64) -> "Embedder":
        """An `elmo export tensorrt` directory (needs the tensorrt extra and the GPU it was built for)."""
        return cls.open(engine_dir, "tensorrt", batch_size)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stateful(self) -> bool:
        return getattr(self.backend, "stateful", None) is not None

    def _char_ids(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        """Shape: B sentences -> (B, T, W) int32 token ids (W = C characters, +1 with words)."""
        return self.backend.tokenizer.batch(sentences)

    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """One backend call. Shape: B sentences -> layers (B, L+1, T, 2P), mask (B, T)."""
        ids = self._char_ids(sentences)
        if ids.shape[1] == 0:
            L1, D = self.config.n_output_layers, self.config.output_dim
            return np.zeros((len(sentences), L1, 0, D), np.float32), np.zeros((len(sentences), 0), bool)
        return self.backend.run(ids)

    def _batches(self, sentences: Sequence[Sequence[str]], batch_size: int) -> Iterator[list[int]]:
        if self.stateful:
            order = list(range(len(sentences)))
        else:
            order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        for start in range(0, len(order), batch_size):
            yield order[start : start + batch_size]

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int | None = None,
                        output: str = "all", mix_weights: Sequence[float] | None = None, gamma: float = 1.0,
                        layer_norm: bool = False, pool: str | None = None) -> list[np.ndarray | None]:
        """Vectors of each sentence, in input order.

        ``output``: 'all' gives (L+1, T_i, 2P) per sentence; 'top', 'average' and 'mixed' give
        (T_i, 2P). ``mix_weights`` are the scalar mix's unnormalised s (softmax applied).
        An empty sentence gives an empty array. ``pool`` 'mean' or 'max' gives one vector per
        sentence instead, over its tokens only: (L+1, 2P) for 'all', else (2P,); None for an
        empty sentence.
        """
        check_sentences(sentences)
        check_output(output, self.config.n_output_layers, mix_weights)
        if pool is not None and pool not in POOLS:
            raise InputError(f"pool must be None or one of {POOLS}, got {pool!r}")
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, got {batch_size}")
        results: list[np.ndarray | None] = [None] * len(sentences)
        # top / average / mixed are weighted sums of the layers, which a stateless backend computes
        # before copying them out (reduce_layers is the reference it is tested against).
        weights = None if layer_norm or self.stateful else layer_weights(output, self.config.n_output_layers,
                                                                          mix_weights, gamma)
        for rows in self._batches(sentences, batch_size):
            batch = [sentences[i] for i in rows]
            if weights is not None and max(map(len, batch)) > 0:
                reduced, mask = self.backend.run_combined(self._char_ids(batch), weights)  # (B, T, D)
            else:
                layers, mask = self.embed_batch(batch)
                reduced = reduce_layers(layers, mask, output, mix_weights, gamma, layer_norm)  # (B, [L+1,] T, D)
            if pool is not None:
                tokens = np.moveaxis(reduced, 2, 1) if output == "all" else reduced  # (B, T, [L+1,] D)
                pooled = pool_tokens(torch.from_numpy(tokens), torch.from_numpy(mask), pool).numpy()  # (B, [L+1,] D)
                for k, i in enumerate(rows):
                    results[i] = pooled[k].astype(np.float32) if len(sentences[i]) else None
                continue
            for k, i in enumerate(rows):
                n = len(sentences[i])
                results[i] = np.ascontiguousarray(reduced[k, :, :n] if output == "all" else reduced[k, :n])
        return results
