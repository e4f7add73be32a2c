"""What a Spark executor's Python worker runs (``pipelines.spark_runner``, ``pipelines.spark``): one
model at a time (``predictor_for``) and a shard's task (``embed_task``), whose outcome crosses to the
driver as data: a commit record, or a ``TaskError`` the driver turns back into the typed error.

PySpark reuses its Python workers across tasks and jobs: the worker keeps the model of the run its
tasks ask for, and closes it when a task of another run (another model, pin or options) arrives, so
a long-lived session holds one model per worker whatever number of jobs it ran.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from elmo_core.errors import ConfigError, ElmoError, InputError, SettingError, WeightsError
from inference.errors import BackendUnavailableError, ModelChangedError
from inference.model_run import ModelRun

from .os_errors import lasting_os_error
from .errors import NonFiniteError, OutputDirError
from .predictor import ElmoPredictor
from .shard_loop import embed_shards
from .source import Shard
from .stages import StageClock

# A worker's error as the driver rebuilds it: the first kind it is an instance of (subclasses first).
ERROR_KINDS: dict[str, type[ElmoError]] = {
    "model_changed": ModelChangedError, "non_finite": NonFiniteError, "output_dir": OutputDirError,
    "backend_unavailable": BackendUnavailableError, "setting": SettingError, "input": InputError,
    "weights": WeightsError, "config": ConfigError, "other": ElmoError}
RESULT = pa.schema([("record", pa.string()), ("seconds", pa.string()), ("process", pa.string()), ("loads", pa.int64()),
                    ("error", pa.struct([("kind", pa.string()), ("message", pa.string()), ("shard", pa.string()),
                                         ("row", pa.int64())]))])  # a task's row per shard: a record or an error


@dataclass(frozen=True)
class TaskError:
    """An error a task met, as data: its kind (a key of ``ERROR_KINDS``), its message, the shard
    (a file's rows) it names and the row, where the error names one (``NonFiniteError``)."""
    kind: str
    message: str
    shard: str
    row: int | None = None

    @classmethod
    def of(cls, e: ElmoError, shard: str) -> "TaskError":
        kind = next(k for k, t in ERROR_KINDS.items() if isinstance(e, t))
        return cls(kind, str(e), shard, e.row if isinstance(e, NonFiniteError) else None)

    def error(self) -> ElmoError:
        """The typed error, as the local runner raises it."""
        if self.kind == "non_finite":
            return NonFiniteError(self.message, self.row if self.row is not None else -1)
        return ERROR_KINDS[self.kind](self.message)


@dataclass
class _Held:
    """This worker's model: the run it was loaded for (a key), the predictor or the refusal of its
    files (kept while the files stay as they were refused), and how many models the worker loaded."""
    key: str | None = None
    predictor: ElmoPredictor | None = None
    refused: tuple[ModelChangedError, Any] | None = None
    loads: int = 0

    def hold(self, key: str) -> None:
        """Keep ``key``'s model from now on; the model of another run is closed."""
        if key != self.key:
            if self.predictor is not None:
                self.predictor.close()
            self.key, self.predictor, self.refused = key, None, None


_HELD = _Held()


def predictor_for(run: ModelRun, options: dict) -> ElmoPredictor:
    """This worker's predictor of ``run`` (a pinned run's files hashed once, before they load); the
    worker's previous model is closed where it was another run's. A refusal (files that are not the
    pinned ones) is kept while the files stay as they were refused, so that the worker's next tasks
    refuse without hashing them again."""
    _HELD.hold(json.dumps([run.to_dict(), run.pin, options], sort_keys=True))
    if _HELD.predictor is None:
        seen = run.signature()
        if _HELD.refused is not None and _HELD.refused[1] == seen:
            raise _HELD.refused[0]
        try:
            _HELD.predictor = ElmoPredictor(run, options)
        except ModelChangedError as e:
            _HELD.refused = (e, seen)
            raise
        _HELD.loads += 1
    return _HELD.predictor


def model_loads() -> int:
    """Models this Python worker has loaded (one per job is the point of ``predictor_for``)."""
    return _HELD.loads


def embed_task(run: ModelRun, options: dict, shards: list[Shard], out: Any, schema: pa.Schema,
               job_digest: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs over its partition of shard indices (``mapInArrow``): a row of
    ``RESULT`` per shard."""
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pylist([_shard_result(run, options, shards[index], out, schema, job_digest)],
                                                 schema=RESULT)
    return task


def _shard_result(run: ModelRun, options: dict, shard: Shard, out: Any, schema: pa.Schema, job_digest: str) -> dict:
    clock = StageClock()
    row: dict[str, Any] = {"record": None, "seconds": None, "process": f"{socket.gethostname()}:{os.getpid()}",
                           "loads": None, "error": None}
    try:
        predictor = predictor_for(run, options)
        record = embed_shards(predictor, [shard], out, schema, job_digest, clock=clock)[0]
        row.update(record=json.dumps(record), seconds=json.dumps(clock.seconds))
    except ElmoError as e:  # the input's, the output's, the model's, the vectors': a retry fails alike
        row["error"] = asdict(TaskError.of(e, shard.name))
    except OSError as e:  # a full or read-only disk is one too; another is retried by Spark
        lasting = lasting_os_error(e, out)
        if lasting is None:
            raise
        row["error"] = asdict(TaskError.of(lasting, shard.name))
    row["loads"] = model_loads()
    return row
