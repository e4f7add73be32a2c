"""The options of an ``elmo embed`` job, validated once, shared by the CLI, the API and both runners.

Options split in two: those that change the output (they are part of the job's identity, and a
resumed job must use the same ones) and those that only change how fast it runs.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

from elmo_core.bounds import MAX_COUNT, check_count, check_flags, check_gpus, setting
from elmo_core.errors import InputError, SettingError
from elmo_core.names import ENGINES, VECTOR_LAYOUTS, comma_separated
from inference.batching import BatchPolicy
from elmo_core.vectors import VectorRequest
from inference.row_shape import RowShape
from inference.run_settings import RunSettings
from runtime import process_cpu_budget
from runtime.settings import MAX_THREADS

from .schema import COMPRESSIONS
from .shard_files import FORMATS, ShardFormat

if TYPE_CHECKING:  # the options are made and checked (the CLI's flags too) without the model code
    from inference.model_run import ModelRun

# Spark's master URLs: local, local[N], local[*], local[N,F], local-cluster[N,C,M], yarn, and any
# scheme://... (spark://HOST:PORT, k8s://..., a cluster manager plugin's)
SPARK_MASTER = r"local(\[([1-9][0-9]*|\*)(,[1-9][0-9]*)?\])?|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*\]|yarn" \
               r"|[a-z][a-z0-9+.-]*://\S+"


@dataclass(frozen=True)
class EmbedOptions:
    """Everything ``elmo embed`` takes besides INPUT, OUTPUT_DIR, MODEL and how the model runs (the
    run's settings: ``inference.run_settings.RunSettings``, made into the job's ``ModelRun``): the
    columns read, what the vectors become (``vectors``: the one ``VectorRequest``, whose fields are
    flags of their own), how they are written and how the job runs and scales out."""

    text_column: str = setting("text", "whitespace-tokenized text (ignored with --tokens-column)", "columns",
                               meaning="text_column")
    tokens_column: str | None = setting(None, "list<string> tokens (instead of --text-column)", "columns")
    id_column: str | None = setting(None, "copied to the output first", "columns", parquet_only=True)
    keep_columns: tuple[str, ...] = setting((), "comma-separated columns copied to the output", "columns",
                                            parquet_only=True)
    vectors: VectorRequest = setting(VectorRequest(), cli=False)  # the flags: its own fields
    max_sentence_length: int = setting(BatchPolicy.max_sentence_length, "longer rows are embedded in overlapping "
                                       "windows and joined back", "vectors", meaning="max_sentence_tokens")
    window_context: int | None = setting(BatchPolicy.window_context, "context tokens each side of a window "
                                         "(default M/8)", "vectors")
    rows_per_shard: int | None = setting(None, "one output shard per this many rows of one input file (default: "
                                         "100,000 on the local engine; on Spark and Ray two shards per task slot, "
                                         "500 to 100,000 rows: see docs/pipelines.md)", "running", parquet_only=True)
    engine: str = setting("local", "the runner: where the batches run, not what computes them (a job stopped under one "
                          "engine resumes under another)", "running", choices=ENGINES, parquet_only=True,
                          runtime_only=True)
    max_tokens_per_batch: int | None = setting(None, None, "running", meaning="max_batch_tokens",
                                               runtime_only=True)  # None: the run's (``ModelRun.batch``)
    sort_window_rows: int | None = setting(None, "rows sorted by length together before batching (then restored to "
                                           "input order; default: the run's, a sixteenth of its sort window "
                                           "tokens)", "running",
                                           runtime_only=True)
    sort_window_tokens: int | None = setting(None, "at most this many tokens in one sort window (bounds memory; local "
                                             "engine; default: the run's, on a CPU 16384 to 65536 by the model's "
                                             "width, 8 batches on a GPU)",
                                             "running", runtime_only=True, parquet_only=True)
    workers: int = setting(1, "--engine ray: copies of the model, each an actor taking shards", "running",
                           meaning="replicas", runtime_only=True)
    writer_threads: int | None = setting(None, "shards encoded at once (per replica; default: 1 on a CPU, where the "
                                         "model takes the cores; on a GPU the host's cores less four, at least 8 "
                                         "where they allow, at most 16); see docs/pipelines.md", "running",
                                         runtime_only=True, parquet_only=True)
    prefetch: int = setting(4, cli=False, runtime_only=True)  # prepared windows queued ahead of the model
    resume: bool = setting(False, "keep verified shards, redo the rest", "running", runtime_only=True,
                           parquet_only=True)
    quiet: bool = setting(False, "no progress bar and summary", "running", meaning="quiet", runtime_only=True)
    ray_address: str | None = setting(None, None, "running", meaning="ray_address", runtime_only=True)
    num_gpus_per_worker: float = setting(0.0, None, "running", meaning="num_gpus_per_replica", runtime_only=True)
    spark_master: str | None = setting(None, "--engine spark: local[N], spark://HOST:PORT, yarn, k8s://... (default "
                                       "local[*])", "running", runtime_only=True)
    verbose: bool = setting(False, "--engine spark: Spark's own log lines from INFO (default: WARN)", "running",
                            runtime_only=True)
    spark_conf: tuple[str, ...] = setting((), "--engine spark: a Spark setting, e.g. spark.executor.memory=8g "
                                          "(repeatable)", "running", action="append", metavar="KEY=VALUE",
                                          runtime_only=True)
    verify_inputs: bool = setting(False, "hash every input file's bytes into the job (an edit that keeps size and "
                                  "mtime is seen)", "running", runtime_only=True, parquet_only=True)
    compression: str | None = setting(None, "of the output shards (default: snappy for Parquet, none for Arrow; "
                                      "measured: snappy, lz4 and none about as fast, zstd 8%% smaller in float16 and "
                                      "slower)", "vectors", choices=COMPRESSIONS, runtime_only=True, parquet_only=True)
    format: str = setting("parquet", cli=False, choices=tuple(FORMATS))  # the flag: elmo_cli.cmd_embed (hdf5 too)
    vector_layout: str = setting("floats", "each token's vector in the shards: floats (a list of floats, as SQL reads "
                                 "them) or binary (its bytes, no per-float levels: Parquet writes it ~6x faster; "
                                 "read with pipelines.schema.vector_array)", "vectors", choices=VECTOR_LAYOUTS,
                                 parquet_only=True)
    rows_per_shard_reason: str = setting("", cli=False, runtime_only=True)  # why this size (pipelines.shard_size)

    def __post_init__(self) -> None:
        check_flags(self)
        _check_choice("engine", self.engine, ENGINES)
        _check_choice("format", self.format, tuple(FORMATS))
        _check_choice("vector_layout", self.vector_layout, VECTOR_LAYOUTS)
        if self.compression is None:  # the format's own
            object.__setattr__(self, "compression", self.shard_format.compressions[0])
        _check_choice("compression", self.compression, self.shard_format.compressions)  # the format's
        if self.rows_per_shard is not None:
            check_count("rows_per_shard", self.rows_per_shard)
        for name in ("workers", "prefetch"):
            check_count(name, getattr(self, name))
        for name in ("max_tokens_per_batch", "sort_window_rows", "sort_window_tokens"):
            check_count(name, getattr(self, name), optional="the run's")
        check_count("writer_threads", self.writer_threads, high=MAX_THREADS, optional="the run's")  # each a thread
        _check_columns(self)
        self.policy()  # validates the batching options
        check_gpus("num_gpus_per_worker", self.num_gpus_per_worker)
        if self.spark_master is not None and not re.fullmatch(SPARK_MASTER, self.spark_master):
            raise InputError(f"--spark-master {self.spark_master!r}: not a Spark master URL; give local[N], "
                             f"local[N,F] (F: a task's attempts), local[*], spark://HOST:PORT, yarn or "
                             f"k8s://https://HOST:PORT")
        for kv in self.spark_conf:
            key, _, value = kv.partition("=")
            if "=" not in kv or not key.strip():
                raise InputError(f"--spark-conf {kv!r}: give KEY=VALUE, e.g. spark.executor.memory=8g")
            if key.strip() == "spark.task.maxFailures" and not (re.fullmatch(r"[0-9]{1,10}", value)
                                                              and 0 < int(value) <= MAX_COUNT):
                raise InputError(f"--spark-conf {kv}: the attempts a task gets before the job fails, a whole number "
                                 f"from 1 to {MAX_COUNT} (e.g. spark.task.maxFailures=4)")
        _check_engine_flags(self)  # values first: a bad one is named as such whatever the engine

    def sized_for(self, run: ModelRun, rows_per_shard: tuple[int, str] | None = None) -> "EmbedOptions":
        """These options with what was left to the run settled: the batch budget and sort windows
        (the run's, ``ModelRun.batch``), the writer threads (``default_writers``) and the shard size
        (``pipelines.shard_size``), where given. Made once by ``plan_job`` from checked records: not checked again
        (the vectors' request made once stays with it: ``vectors``)."""
        sized = copy.copy(self)
        for name, value in (("max_tokens_per_batch", self.max_tokens_per_batch or run.batch.tokens),
                            ("sort_window_rows", self.sort_window_rows or run.batch.window_rows),
                            ("sort_window_tokens", self.sort_window_tokens or run.batch.window_tokens),
                            ("writer_threads", self.writer_threads or default_writers(run.device)),
                            *((("rows_per_shard", rows_per_shard[0]), ("rows_per_shard_reason", rows_per_shard[1]))
                              if rows_per_shard else ())):
            object.__setattr__(sized, name, value)
        return sized

    def settle(self, run: ModelRun) -> tuple[ModelRun, "EmbedOptions"]:
        """``run`` with the batch budget and sort windows these options ask where they do
        (``ModelRun.batched``: what its line and manifest report is what runs), and these options
        ``sized_for`` it. Settled once: a job's run and options given again come back the same."""
        run = run.batched(self.max_tokens_per_batch, self.sort_window_tokens, self.sort_window_rows)
        return run, self.sized_for(run)

    @property
    def shard_format(self) -> ShardFormat:
        return FORMATS[self.format]

    def policy(self, rows: int | None = None) -> BatchPolicy:
        """How rows become model batches (windows, token budget); ``rows``: the run's static rows
        (``ModelRun.batch``), where its layout has them."""
        tokens = self.max_tokens_per_batch or BatchPolicy.max_tokens_per_batch  # the least any run's budget is
        return BatchPolicy(self.max_sentence_length, self.window_context, tokens, RowShape(rows) if rows else None)

    @property
    def context(self) -> int:
        return self.policy().context

    @property
    def input_columns(self) -> list[str]:
        """The columns read from the input, in output order (id, kept columns), then the text."""
        text, cols = self.tokens_column or self.text_column, self.passthrough_columns
        return cols + ([text] if text not in cols else [])

    @property
    def passthrough_columns(self) -> list[str]:
        return ([self.id_column] if self.id_column else []) + list(self.keep_columns)

    @classmethod
    def coerce(cls, value: "EmbedOptions | Mapping[str, Any] | None" = None, **overrides: Any) -> "EmbedOptions":
        """An EmbedOptions from an instance, a dict (e.g. from JSON) or keyword arguments."""
        if isinstance(value, EmbedOptions) and not overrides:
            return value  # checked when it was made
        base = {f.name: getattr(value, f.name) for f in fields(cls)} if isinstance(value, EmbedOptions) \
            else dict(value or {})
        base.update(overrides)
        known = {f.name for f in fields(cls)} | set(VECTOR_FIELDS)
        unknown = sorted(set(base) - known)
        if unknown:
            from inference.run_settings import RUN_SETTINGS

            raise InputError(f"unknown embed options {unknown}; known: {sorted(known)}, and the run's "
                             f"{sorted(RUN_SETTINGS)} with a model path")
        base["vectors"] = _vectors(base, base.pop("vectors", None))
        for name in ("keep_columns", "spark_conf"):
            if base.get(name) is not None:
                base[name] = _as_tuple(base[name], str, name)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "vectors"}
        d.update(self.vectors.to_dict())  # flat: the keys every job's identity has had
        d.update(keep_columns=list(self.keep_columns), spark_conf=list(self.spark_conf), window_context=self.context)
        return d

    def identity(self, backend: str, precision: str, **settled: Any) -> dict[str, Any]:
        """The options that change the output, i.e. that a resumed job must keep (``output_options``),
        with the two of the run's that do (its backend and precision); ``settled``: fields settled
        since (the job's ``rows_per_shard``, foreseen before the job sizes its options)."""
        return output_options({**self.to_dict(), **settled, "backend": backend, "precision": precision})


GPU_WRITERS = 16  # the most a GPU job's default takes


def default_writers(device: str, cpus: int | None = None) -> int:
    """A job's writer threads where none are asked: one on a CPU (its cores run the model). On a GPU,
    whose vectors come faster than one core encodes them, the process's CPUs (``cpus``: counted
    here) less four (the model's thread, the reader's, the next batch's planner, one spare) and
    at least 8 where the CPUs less two allow, at most ``GPU_WRITERS``: a thread encodes float32
    Parquet float lists at ~34k tokens/s, and the H200 ran the model alone at 313k (16 CPUs: 12)."""
    if not device.startswith("cuda"):
        return 1
    cpus = process_cpu_budget().count if cpus is None else cpus
    return max(1, min(GPU_WRITERS, cpus - 2, max(8, cpus - 4)))


def output_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a job (its ``to_dict``, or the identity a job recorded) that change the output:
    not the runtime-only ones (a record of a job that counted one of them, e.g. the engine, means the
    same job). fp32, the precision of every job written before the option existed, is left out so that
    those jobs keep their identity; so are the defaults of normalize (False), format (parquet) and
    vector_layout (floats)."""
    return {k: v for k, v in options.items()
            if k not in RUNTIME_ONLY and not (k == "precision" and v == "fp32") and not (k == "normalize" and not v)
            and not (k == "format" and v == "parquet") and not (k == "vector_layout" and v == "floats")}


# Flags of one engine, and the engine: given with another, they would be ignored, so they are refused.
ENGINE_FLAGS = {"workers": ("--replicas", "ray"), "ray_address": ("--ray-address", "ray"),
                "num_gpus_per_worker": ("--num-gpus-per-replica", "ray"), "spark_master": ("--spark-master", "spark"),
                "spark_conf": ("--spark-conf", "spark"), "verbose": ("--verbose", "spark")}


def _check_engine_flags(opts: EmbedOptions) -> None:
    defaults = {f.name: f.default for f in fields(EmbedOptions)}
    for name, (flag, engine) in ENGINE_FLAGS.items():
        value = getattr(opts, name)
        if opts.engine != engine and (tuple(value) if isinstance(value, list) else value) != defaults[name]:
            raise InputError(f"{flag} is for --engine {engine}; this job runs on --engine {opts.engine}: "
                             f"add --engine {engine} or leave {flag} out")


def _check_columns(opts: EmbedOptions) -> None:
    """Each output column once: the id column and the kept columns name different columns."""
    names = opts.passthrough_columns
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"--keep-columns / --id-column name {repeated} more than once; each output column is "
                         f"written once: list it once")


def _vectors(flat: dict[str, Any], given: VectorRequest | Mapping[str, Any] | None) -> VectorRequest:
    """The job's ``VectorRequest``: ``given`` (a request, or its dict), its fields among ``flat``'s
    keys (a library caller's keywords, a manifest's options: popped) over it."""
    named = {k: flat.pop(k) for k in VECTOR_FIELDS if k in flat}
    if not named and isinstance(given, VectorRequest):
        return given  # checked when it was made
    base = given.to_dict() if isinstance(given, VectorRequest) else dict(given or {})
    base.update(named)
    return VectorRequest(**base)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingError(f"`{name}` must be one of {list(choices)}, got {value!r}")


def _as_tuple(value: Any, kind: type, name: str) -> tuple:
    if isinstance(value, str):
        value = comma_separated(value, name)
    try:
        return tuple(kind(v) for v in value)
    except (TypeError, ValueError):
        raise InputError(f"expected a comma-separated list of {kind.__name__}, got {value!r}") from None


VECTOR_FIELDS = tuple(f.name for f in fields(VectorRequest))
RUNTIME_ONLY = frozenset(f.name for cls in (EmbedOptions, RunSettings) for f in fields(cls)
                         if f.metadata.get("runtime_only"))
PARQUET_ONLY = tuple(f.name for cls in (EmbedOptions, VectorRequest) for f in fields(cls)
                     if f.metadata.get("parquet_only"))
