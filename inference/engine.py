"""The one engine from sentences to vectors, behind every door (``Embedder.embed_sentences``,
``elmo embed``'s Parquet and hdf5 outputs on both runners, ``elmo serve``, the Triton model).

``prepare`` cuts the sentences into model batches (``inference.batching``: windows, length sort,
token budget) and turns each into character ids; ``run`` sends every batch through the backend's
``submit`` with the ``VectorRequest`` and puts the results back in input order:

- token vectors: each batch's kept tokens, gathered in output order on the backend's device
  (``take``: only they cross), to their rows of one (N tokens, [L+1,] D) array in the request's
  dtype (computed, normalised and cast on the device) by one scatter;
- pooled: each batch row's partial (the sum or max over its kept tokens, on the device) joined per
  sentence over its windows, then divided, normalised and cast (``finish_pooled``).

Each batch is submitted before the previous one is placed, so on a GPU the host's placing overlaps
the device's next batch; and each batch's host work (``Backend.prepare``: for the torch backend
the lengths, distinct tokens, token cache's plan and rows, ``inference.host_batch``) is done a
batch ahead on a thread while the current one runs, where the backend computes off the host's
cores (``stages_ahead``: torch on CUDA; on a CPU the thread would take the model's cores).
``clock`` (optional) times the "model" and "assemble" stages.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol, Sequence

import numpy as np

from elmo_core.errors import ElmoError

from .backends import Backend
from .batching import BatchPolicy, Plan, plan_batches

__all__ = ["Plan", "Prepared", "prepare", "run"]
from .outputs import finish_pooled
from elmo_core.vectors import VectorRequest


class Clock(Protocol):
    def stage(self, name: str) -> ContextManager[Any]: ...


class _NoClock:
    def stage(self, name: str) -> ContextManager[Any]:
        return contextlib.nullcontext()


@dataclass
class Prepared:
    """Sentences ready for the model: the plan and each model batch's character ids."""

    plan: Plan
    char_ids: list[np.ndarray]  # one (B, T, W) int32 per plan batch


def prepare(backend: Backend, rows: Sequence[Sequence[str] | None], policy: BatchPolicy,
            max_rows: int | None = None) -> Prepared:
    """Windows, batches and character ids of ``rows`` (None: a null row, no vectors)."""
    plan = plan_batches(rows, policy, max_rows)
    return Prepared(plan, [backend.tokenizer.batch(b.tokens) for b in plan.batches])  # type: ignore[attr-defined]


def run(backend: Backend, prepared: Prepared, request: VectorRequest, clock: Clock | None = None,
        empty: Callable[..., np.ndarray] = np.empty) -> np.ndarray:
    """Every batch through the backend, the results in input order; token vectors in an array from
    ``empty`` (``np.empty``'s signature: a job's ``runtime.buffers.Lease.empty``), every row written.

    Shape: -> (N tokens, [L+1,] D) in the request's dtype, the sentences' tokens one after
    another; pooled: (R, [L+1,] D), NaN rows for sentences without a token.
    """
    backend.check_request(request)
    clock = clock or _NoClock()
    config, plan = backend.config, prepared.plan
    trailing = request.mode.shape(config.n_output_layers, config.output_dim)
    if request.pool is None:
        out = empty((plan.tokens, *trailing), request.dtype)  # (N, [L+1,] D)
        place: Callable[[np.ndarray, np.ndarray], None] = out.__setitem__  # (n,) output rows, (n, [L+1,] D)
    else:
        fill = 0.0 if request.pool == "mean" else -np.inf
        out = np.full((len(plan.lengths), *trailing), fill, dtype=np.float64)  # (R, [L+1,] D) joined partials
        place = lambda sentence, got: _join_partials(out, sentence, got, request.pool)  # noqa: E731
    pending = None  # the previous batch: its result is read while this one runs (on a GPU)
    with _Ahead(backend, prepared.char_ids) as ahead:
        for batch, ids in zip(plan.batches, prepared.char_ids):
            with clock.stage("model"):
                host = ahead.next()
                if request.pool is None:  # the kept tokens, in output order, placed by one scatter
                    rows, cols, where = batch.gather_index()  # (n,) each
                    result = backend.submit(ids, request, prepared=host, take=rows * ids.shape[1] + cols)
                else:  # each row's partial, joined to its sentence's
                    where = plan.sentence_of(batch)  # (B,)
                    result = backend.submit(ids, request, batch.keep_mask(ids.shape[1]), prepared=host)
            if pending is not None:
                _read(clock, place, *pending)
            pending = where, result
        if pending is not None:
            _read(clock, place, *pending)
    if request.pool is None:
        return out
    with clock.stage("assemble"):
        return finish_pooled(out, plan.lengths, request)


class _Ahead:
    """Each batch's host work (``Backend.prepare``), handed out in order: where the backend
    ``stages_ahead``, the next batch's is started on a thread as the current one is handed out;
    elsewhere each is made when asked. One made for a batch that is not submitted (the loop
    stopped) is abandoned."""

    def __init__(self, backend: Backend, char_ids: list[np.ndarray]) -> None:
        self.backend, self.char_ids, self.k = backend, char_ids, 0
        ahead = backend.stages_ahead and len(char_ids) > 1
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="elmo-prepare") if ahead else None
        self.ahead: Future | None = None

    def next(self) -> object | None:
        ahead, self.ahead = self.ahead, None
        got = self.backend.prepare(self.char_ids[self.k]) if ahead is None else ahead.result()
        self.k += 1
        if self.pool is not None and self.k < len(self.char_ids):
            self.ahead = self.pool.submit(self.backend.prepare, self.char_ids[self.k])
        return got

    def __enter__(self) -> "_Ahead":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ahead is not None:
            with contextlib.suppress(ElmoError):  # its error is a batch's that is not run
                self.backend.abandon(self.ahead.result())
        if self.pool is not None:
            self.pool.shutdown()


def _read(clock: Clock, place: Callable[[np.ndarray, np.ndarray], None], where: np.ndarray,
          result: Callable[[], np.ndarray]) -> None:
    with clock.stage("model"):
        got = result()
    with clock.stage("assemble"):
        place(where, got)


def _join_partials(out: np.ndarray, sentence: np.ndarray, got: np.ndarray, pool: str) -> None:
    """Each row's partial into its sentence's (a sentence's windows may be in several batches).
    Shape: out (R, [L+1,] D) float64, sentence (B,), got (B, [L+1,] D) float32."""
    if pool == "mean":
        np.add.at(out, sentence, got)
    else:
        np.maximum.at(out, sentence, got)
