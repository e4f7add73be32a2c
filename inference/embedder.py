"""The user-facing API: sentences in, ELMo vectors out, whatever the backend."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from elmo_core.bounds import check_count
from elmo_core.pooling import pool_ragged
from elmo_core.chars import check_sentences, token_type_error
from elmo_core.errors import InputError, SettingError, TokenTypeError

from . import engine
from .backends import Backend
from .batching import BatchPolicy
from .errors import NonFiniteError
from .outputs import first_non_finite, reduce_layers, unit_length
from elmo_core.vectors import VectorRequest, check_output
from .model_run import resolve_run
from .run_settings import RUN_SETTINGS
from .registry import backend_kind


def _check_batching(batch_size: object, policy: object) -> None:
    """An Embedder's ``batch_size`` (None: the token budget alone) and ``policy`` (None: the run's)."""
    check_count("batch_size", batch_size, optional="the token budget alone")
    if policy is not None and not isinstance(policy, BatchPolicy):
        raise SettingError(f"`policy` must be an inference.batching.BatchPolicy, got {type(policy).__name__}")


class Embedder:
    """Embeds tokenized sentences with a backend: the one engine behind every door.

    Stateless backends see ``inference.batching``'s plan: long sentences in windows, every piece
    sorted by length into batches under ``policy``'s token budget (and ``batch_size`` rows where
    given); the vectors come back in input order. A stateful backend sees the sentences in the
    order given, ``batch_size`` (default 64) rows a call, unwindowed.
    """

    def __init__(self, backend: Backend, batch_size: int | None = None, policy: BatchPolicy = BatchPolicy()) -> None:
        _check_batching(batch_size, policy)
        self._hold(backend, batch_size, policy)

    def _hold(self, backend: Backend, batch_size: int | None, policy: BatchPolicy) -> None:
        """The Embedder's state, its batching checked (``__init__``, or ``open`` before the model loads)."""
        self.backend = backend
        self.batch_size = batch_size
        self.policy = policy
        self.config = backend.config
        self.closed = False

    @classmethod
    def open(cls, model: str | Path, backend: str | None = None, batch_size: int | None = None,
             policy: BatchPolicy | None = None, **options: Any) -> "Embedder":
        """Any backend of the registry, through the one ``ModelRun``: ``options`` are ``resolve_run``'s
        (device, threads, precision, weights, token_embeddings, token_vocab), the rest the backend's own
        (``inference.registry.open_backend``: torch's ``stateful``, onnx's ``providers``, ...).
        ``policy``: None batches under the run's token budget (``ModelRun.batch``: the device's).
        ``threads`` (the torch backend's) sets the process's torch threads: torch has one pool a
        process, so the Embedder opened last decides them for every Embedder of the process."""
        _check_batching(batch_size, policy)  # before the model loads
        asked = {k: options.pop(k) for k in RUN_SETTINGS if k in options and k != "backend"}
        run = resolve_run(model, backend=backend, **asked)
        embedder = cls.__new__(cls)
        embedder._hold(run.open(**options), batch_size, policy or run.batch.policy())
        return embedder

    @classmethod
    def from_files(cls, options: str | Path, weights: str | Path | None = None, backend: str = "torch",
                   stateful: bool = False, batch_size: int | None = None, threads: int | None = None,
                   device: str = "cpu", precision: str | None = None) -> "Embedder":
        """Published ELMo files (options.json + weights .hdf5), or a model directory as ``options``.

        ``device``: where the torch backend runs ('cpu', 'cuda', 'cuda:1', ...); ``precision``: None
        is the device's default (fp32 on a CPU, ``auto`` on CUDA: ``ModelRun.precision_reason``).
        """
        if backend_kind(backend).exported:
            raise InputError(f"from_files builds the torch backend; for {backend!r} use its export directory "
                             f"(Embedder.from_onnx / from_tensorrt)")
        return cls.open(options, "torch", batch_size, weights=weights, stateful=stateful, threads=threads,
                        device=device, precision=precision)

    @classmethod
    def from_onnx(cls, export_dir: str | Path, providers: Sequence[str] | None = None, threads: int | None = None,
                  batch_size: int | None = None, **kw: object) -> "Embedder":
        """An `elmo export onnx` directory on ONNX Runtime (see inference.onnx_backend.OnnxBackend);
        ``providers`` default to the CPU's."""
        return cls.open(export_dir, "onnx", batch_size, providers=providers, threads=threads, **kw)

    @classmethod
    def from_tensorrt(cls, engine_dir: str | Path, batch_size: int | None = None) -> "Embedder":
        """An `elmo export tensorrt` directory (needs the tensorrt extra and the GPU it was built for)."""
        return cls.open(engine_dir, "tensorrt", batch_size)

    def _check_open(self) -> None:
        if self.closed:
            raise InputError("this Embedder is closed: open another (Embedder.open)")

    def close(self) -> None:
        """Release the backend; a closed Embedder refuses to embed (closing again does nothing)."""
        if not self.closed:
            self.closed = True
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
        self._check_open()
        ids = self._char_ids(sentences)
        if ids.shape[1] == 0:
            L1, D = self.config.n_output_layers, self.config.output_dim
            return np.zeros((len(sentences), L1, 0, D), np.float32), np.zeros((len(sentences), 0), bool)
        return self.backend.run(ids)

    def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int | None = None,
                        output: str = "all", mix_weights: Sequence[float] | None = None, gamma: float = 1.0,
                        layer_norm: bool = False, pool: str | None = None,
                        normalize: bool = False) -> list[np.ndarray | None]:
        """Vectors of each sentence, in input order.

        ``output``: 'all' gives (L+1, T_i, 2P) per sentence; 'top', 'average' and 'mixed' give
        (T_i, 2P). ``mix_weights`` are the scalar mix's unnormalised s (softmax applied).
        An empty sentence gives an empty array. ``pool`` 'mean' or 'max' gives one vector per
        sentence instead, over its tokens only: (L+1, 2P) for 'all', else (2P,); None for an
        empty sentence. ``batch_size``: at most this many rows a backend call (default: the
        Embedder's; the token budget always applies). ``layer_norm`` normalises each layer over a
        model batch's tokens, as bilm-tf's ``weight_layers`` does over its batch. ``normalize``:
        each vector (per token and layer, or pooled) scaled to unit L2 norm, last of all.
        """
        request = VectorRequest(output, mix_weights, gamma, layer_norm, pool, normalize)  # numbers, or "s0,s1,..."
        return self.vectors(sentences, request, batch_size)

    def vectors(self, sentences: Sequence[Sequence[str]], request: VectorRequest,
                batch_size: int | None = None, check_finite: bool = True) -> list[np.ndarray | None]:
        """``embed_sentences`` in the engine's terms (``elmo_core.vectors.VectorRequest``).
        NonFiniteError naming the first sentence whose vectors hold inf or NaN (a ``gamma`` that
        scales them past the dtype's range, or a model that gives them); ``check_finite`` False: a
        door that checks what it hands out itself (a server, each request of a batch)."""
        self._check_open()
        check_sentences(sentences)
        check_output(request.mode, self.config.n_output_layers, request.mix)
        check_count("batch_size", batch_size, optional="the Embedder's")
        batch_size = self.batch_size if batch_size is None else batch_size
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)  # (R,)
        try:
            out = self._computed(sentences, lengths, request, batch_size)  # (N or R, [L+1,] D)
        except TokenTypeError:
            raise token_type_error(sentences) from None  # named in the caller's sentences, not the model's batch
        if check_finite and (row := first_non_finite(out, lengths, request.pool is not None)) is not None:
            raise NonFiniteError(f"sentence {row}: {NonFiniteError.advice(request.dtype, request.gamma)}", row)
        if request.pool is not None:
            return [None if n == 0 else row for n, row in zip(lengths, out)]  # ([L+1,] D) each
        offsets = np.concatenate([[0], np.cumsum(lengths)])  # (R+1,)
        results = [out[offsets[i]:offsets[i + 1]] for i in range(len(sentences))]  # (T_i, [L+1,] D)
        if request.mode.layer_axis:
            results = [np.ascontiguousarray(r.transpose(1, 0, 2)) for r in results]  # (L+1, T_i, D)
        return results

    def _computed(self, sentences: Sequence[Sequence[str]], lengths: np.ndarray, request: VectorRequest,
                  batch_size: int | None) -> np.ndarray:
        """Every token's vectors, or each sentence's pooled. Shape: -> (N, [L+1,] D) or (R, [L+1,] D)."""
        if not self.stateful:
            return engine.run(self.backend, engine.prepare(self.backend, sentences, self.policy, batch_size), request)
        out = self._in_order(sentences, batch_size or 64, request)  # (N, [L+1,] D)
        if request.pool is not None:
            out = pool_ragged(out, lengths, request.pool)  # (R, [L+1,] D)
        if request.normalize:
            out = unit_length(out)  # NaN rows stay NaN
        return out.astype(request.dtype, copy=False)

    def _in_order(self, sentences: Sequence[Sequence[str]], batch_size: int, request: VectorRequest) -> np.ndarray:
        """A stateful backend: the sentences in the order given, ``batch_size`` rows a call.
        Shape: -> (N tokens, [L+1,] D) float32, the sentences' tokens one after another."""
        L1, D = self.config.n_output_layers, self.config.output_dim
        parts = [np.empty((0, *request.mode.shape(L1, D)), np.float32)]
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start:start + batch_size]
            layers, mask = self.embed_batch(batch)  # (B, L+1, T, D)
            reduced = reduce_layers(layers, mask, request.output, request.mix, request.gamma,
                                    request.layer_norm)  # (B, [L+1,] T, D)
            parts += [reduced[k, :, :len(s)].transpose(1, 0, 2) if request.mode.layer_axis else reduced[k, :len(s)]
                      for k, s in enumerate(batch)]  # (T_i, [L+1,] D)
        return np.concatenate(parts).astype(np.float32, copy=False)
