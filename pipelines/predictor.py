"""``ElmoPredictor``: the one class every runner runs (the local loop, Ray actors, Spark tasks).

It loads the backend once in ``__init__``; ``__call__(table) -> table`` is pure: the batch's id and
kept columns, in the same row order, plus the ``elmo`` column. The work is split in two so the
local runner can overlap them: ``prepare`` (tokens, windows, buckets, character ids: CPU-light,
run in a prefetch thread) and ``compute`` (the backend, the output mode, the Arrow column).

The output columns and their types are ``pipelines.schema``'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from elmo_core.errors import InputError
from elmo_core.kinds import Dtype
from inference import engine
from inference.errors import NonFiniteError
from inference.outputs import first_non_finite
from inference.model_run import ModelRun, resolve_run

from inference.run_settings import RunSettings

from .options import EmbedOptions

from .rows import row_tokens
from .schema import arrow_float, elmo_field
from .stages import StageClock


@dataclass
class Prepared:
    """A batch ready for the model: pass-through columns and the engine's plan and char ids."""

    passthrough: pa.Table
    prepared: engine.Prepared
    invalid_utf8: int = 0  # strings whose invalid UTF-8 bytes were dropped

    @property
    def plan(self) -> engine.Plan:
        return self.prepared.plan

    @property
    def char_ids(self) -> list[np.ndarray]:
        return self.prepared.char_ids


def _as_table(batch: Any) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    raise InputError(f"a batch must be a pyarrow Table or RecordBatch, got {type(batch).__name__}")


def _records(run: ModelRun | str | Path, options: EmbedOptions | Mapping[str, Any] | None,
             overrides: dict[str, Any]) -> tuple[ModelRun, EmbedOptions]:
    """(the run, the options) from what a caller gave: a job's records as they are; else made here,
    a model path resolved with the run's settings among the options."""
    if isinstance(run, ModelRun) and isinstance(options, EmbedOptions) and not overrides:
        return run, options
    given = options.to_dict() if isinstance(options, EmbedOptions) else dict(options or {})
    settings, rest = RunSettings.split({**given, **overrides})
    return (run if isinstance(run, ModelRun) else resolve_run(run, settings, job=True)), EmbedOptions.coerce(rest)


class ElmoPredictor:
    """Embeds batches of rows with ``run``'s backend (a model path is resolved here with the run's
    settings among ``options``, as a library caller's). ``options``: an EmbedOptions or its dict (Ray
    passes a dict), sized for the run where the job has not (``EmbedOptions.sized_for``); ``log``: told the run;
    ``pin``: hash the model's files as they load and pin the run to them (a job's first load; a
    run pinned already is checked against its pin wherever it loads: ``ModelRun.open``).

    Shape: a batch of R rows -> the same R rows (id + kept columns) + ``elmo`` (see module doc).
    """

    def __init__(self, run: ModelRun | str | Path, options: EmbedOptions | Mapping[str, Any] | None = None,
                 log: Callable[[str], None] | None = None, pin: bool = False, **overrides: Any) -> None:
        self.run, opts = _records(run, options, overrides)
        self.run, self.options = opts.settle(self.run)  # a job's are settled already: the same record and values
        opts = self.options
        self.policy = opts.policy(self.run.batch.rows)
        if log is not None:
            log(f"loading the model {self.run.describe()}")
        if pin and self.run.pin is None:
            self.backend, identity = self.run.open_identified()
            self.run = self.run.pinned(identity)
        else:
            self.backend = self.run.open()
        self.config = self.backend.config
        self.dim, self.n_layers = self.config.output_dim, self.config.n_output_layers
        self.field = elmo_field(self.dim, self.n_layers, self.options.vectors, self.options.vector_layout)
        self.type = self.field.type
        self.request = self.options.vectors
        self.backend.check_request(self.request)  # before any row is read

    @property
    def model_sha256(self) -> str | None:
        """The sha256 of the weights (or export) this predictor loaded, where its run is pinned."""
        return self.run.pin["sha256"] if self.run.pin else None

    def close(self) -> None:
        self.backend.close()

    def __call__(self, batch: pa.Table | pa.RecordBatch) -> pa.Table:
        return self.compute(self.prepare(batch))

    def prepare(self, batch: Any) -> Prepared:
        """Tokens, windows, length buckets and character ids of a batch (no model call)."""
        table = _as_table(batch)
        opts = self.options
        text = opts.tokens_column or opts.text_column
        missing = [c for c in opts.input_columns if c not in table.column_names]
        if missing:
            raise InputError(f"columns {missing} not in the batch; it has {table.column_names}")
        rows, invalid_utf8 = row_tokens(table.column(text), opts.tokens_column is not None, text)
        return Prepared(table.select(opts.passthrough_columns), engine.prepare(self.backend, rows, self.policy),
                        invalid_utf8)

    def compute(self, prepared: Prepared, clock: StageClock | None = None,
                empty: Callable[..., np.ndarray] = np.empty) -> pa.Table:
        """Run the engine on every model batch (``inference.engine.run``: the output mode, pooling,
        normalisation and dtype on the backend's device) and make the ``elmo`` column in row order,
        on the memory of an array from ``empty`` (a leased buffer: the table must not outlive it)."""
        vectors = engine.run(self.backend, prepared.prepared, self.request, clock, empty)  # (N or R, [L+1,] D)
        with (clock or StageClock()).stage("assemble"):
            lengths = prepared.plan.lengths
            self._check_finite(vectors, lengths)
            if self.request.pool:  # (R, [L+1,] D), NaN where no token -> R vectors, null where no token
                column = self._items(np.ascontiguousarray(vectors), mask=lengths <= 0)
            else:
                column = self._column(vectors, lengths)
            return prepared.passthrough.append_column(self.field, column)

    def _check_finite(self, vectors: np.ndarray, lengths: np.ndarray) -> None:
        """NonFiniteError naming the first row whose vectors hold inf or NaN (``first_non_finite``).
        Shape: vectors (N or R, [L+1,] D), lengths (R,)."""
        row = first_non_finite(vectors, lengths, self.request.pool is not None)
        if row is None:
            return
        raise NonFiniteError(NonFiniteError.advice(self.request.dtype, self.request.gamma, flags=True), row)

    def _column(self, out: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """Shape: out (N, [L+1,] D) in the output dtype, lengths (R,) (-1: null) -> R list values."""
        offsets = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))]).astype(np.int32)  # (R+1,)
        return pa.ListArray.from_arrays(pa.array(offsets), self._items(out), type=self.type, mask=pa.array(lengths < 0))

    def _items(self, values: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
        """One item per leading row of ``values`` (N, [L+1,] D), on its memory (no copy): a binary
        layout's bytes, or the floats nested per ``schema.vector_item``."""
        item_type = self.type if self.request.pool else self.type.value_type
        validity = None if mask is None else pa.array(~mask).buffers()[1]
        nulls = -1 if mask is not None else 0
        if pa.types.is_fixed_size_binary(item_type):
            return pa.Array.from_buffers(item_type, len(values), [validity, pa.py_buffer(values)], null_count=nulls)
        flat = pa.Array.from_buffers(arrow_float(Dtype.of_numpy(values.dtype)), values.size, [None, pa.py_buffer(values)])
        inner: pa.Array = pa.FixedSizeListArray.from_arrays(flat, self.dim)
        if self.request.mode.layer_axis:  # (N, L+1, D): the layers' vectors, then each item's list of layers
            inner = pa.FixedSizeListArray.from_arrays(inner, self.n_layers)
        return inner if mask is None else pa.FixedSizeListArray.from_arrays(inner.flatten(), type=item_type,
                                                                            mask=pa.array(mask))
