"""The options of an ``elmo embed`` job, validated once, shared by the CLI, the API and both runners.

Options split in two: those that change the output (they are part of the job's identity, and a
resumed job must use the same ones) and those that only change how fast it runs.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from elmo_core.errors import ElmoError, InputError
from elmo_core.names import DTYPES, ENGINES, POOLS, resolve_output
from inference.batching import BatchPolicy
from inference.outputs import VectorRequest
from inference.registry import BACKEND_NAMES, check_precision_for, torch_options
from runtime import check_threads

from .schema import COMPRESSIONS

MAX_COUNT = 2**31 - 1  # rows, tokens, workers: what a 32-bit offset indexes


# Options that do not change a single output value; they may differ between a run and its resume.
# weights: the model's identity (its sha256) is part of the job's, whatever names its file;
# device: CPU and GPU agree to float rounding, as thread counts do.
RUNTIME_ONLY = frozenset({"max_tokens_per_batch", "sort_window_rows", "sort_window_tokens", "workers",
                          "writer_threads", "threads", "quiet", "ray_address", "num_gpus_per_worker", "resume", "prefetch",
                          "spark_master", "spark_conf",
                          "device", "weights", "verify_inputs", "compression", "token_embeddings",
                          "token_vocab", "precision_reason"})


class OutputDirError(ElmoError):
    """OUTPUT_DIR is not empty, holds another job's output, or holds files this job did not write."""


class ShardPublishedError(OutputDirError):
    """Another writer published the shard first (a retried or speculative task of the same job, or
    the earlier attempt of a killed one); ``sink.ShardWriter.commit`` adopts what it published."""


class NonFiniteError(ElmoError):
    """A row's vectors hold inf or NaN; ``row`` is its index in the batch the predictor was given."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


class WorkerLostError(ElmoError):
    """A worker of the job died (killed, out of memory, its node gone): its shard was not committed."""


@dataclass(frozen=True)
class EmbedOptions:
    """Everything ``elmo embed`` takes besides INPUT, OUTPUT_DIR and MODEL."""

    backend: str = "torch"
    text_column: str = "text"  # whitespace-tokenized text; ignored when tokens_column is set
    tokens_column: str | None = None  # list<string>
    id_column: str | None = None
    keep_columns: tuple[str, ...] = ()
    output: str = "mixed"  # mixed | all | top | average | layer:N (elmo_core.names.OUTPUT_NAMES)
    pool: str | None = None  # mean | max: one vector per row (over its tokens) instead of one per token
    normalize: bool = False  # each vector (per token and layer, or pooled) scaled to unit L2 norm
    mix: tuple[float, ...] | None = None  # scalar mix s (before softmax); None = equal weights
    gamma: float = 1.0
    dtype: str = "float32"
    max_sentence_length: int = BatchPolicy.max_sentence_length  # longer rows: windows (inference.batching)
    window_context: int | None = BatchPolicy.window_context  # context each side of a window; None = M // 8
    rows_per_shard: int = 100_000  # one output shard per this many rows of one input file
    engine: str = "local"  # the runner (--engine local|ray|spark): where the batches run, not what computes them
    max_tokens_per_batch: int = BatchPolicy.max_tokens_per_batch  # padded tokens (rows x longest row) a call
    sort_window_rows: int = 1024  # rows sorted by length together, then restored to input order
    sort_window_tokens: int = 16_384  # ... and at most this many tokens (bounds a window's vectors)
    workers: int = 1  # Ray actors (the local runner runs one model)
    writer_threads: int = 1  # shards encoded at once, each by one thread (per runner process)
    threads: int | None = None  # torch intra-op threads; None = torch's default
    prefetch: int = 4  # prepared windows queued ahead of the model
    resume: bool = False
    quiet: bool = False
    ray_address: str | None = None
    num_gpus_per_worker: float = 0.0
    spark_master: str | None = None  # --engine spark: local[N], spark://HOST:PORT, yarn, ...; None = local[*]
    spark_conf: tuple[str, ...] = ()  # --engine spark: KEY=VALUE Spark settings
    device: str = "cpu"  # cpu | cuda | cuda:N: where the torch or ONNX Runtime backend runs
    weights: str | None = None  # the weights file, when MODEL's directory holds several (torch backend)
    verify_inputs: bool = False  # hash every input file's bytes into the job's identity (see docs)
    compression: str = "snappy"  # of the output shards: snappy | none | lz4 | zstd (the same values)
    token_embeddings: str | None = None  # a token-embedding file whose tokens skip the char-CNN (torch)
    token_vocab: str | None = None  # the vocabulary of a token-embedding file that does not list its tokens
    precision: str = "fp32"  # the torch backend's matrix products: fp32 | tf32 (CUDA) | bf16 | fp16
    precision_reason: str = ""  # why this precision (--precision auto's choice), recorded in the manifest

    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, BACKEND_NAMES)
        output, pool = resolve_output(self.output, self.pool)  # TF-Hub's names (word_emb, default, ...): ours
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "pool", pool)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("engine", self.engine, ENGINES)
        _check_choice("compression", self.compression, COMPRESSIONS)
        if self.pool is not None:
            _check_choice("pool", self.pool, POOLS)
        for name in ("rows_per_shard", "sort_window_rows", "sort_window_tokens", "workers", "writer_threads",
                     "prefetch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_COUNT:
                raise InputError(f"{name} must be a positive integer (at most {MAX_COUNT}), got {value!r}")
        check_threads(self.threads)
        _check_columns(self)
        self.policy  # validates the batching options
        self.request  # validates the output's numbers (mix, gamma: finite, in range)
        if self.mix is not None and self.output != "mixed":
            raise InputError(f"--mix only applies to --output mixed (got --output {self.output})")
        if not 0 <= self.num_gpus_per_worker <= MAX_COUNT:  # also refuses nan
            raise InputError(f"--num-gpus-per-worker must be a number >= 0, got {self.num_gpus_per_worker}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise InputError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.weights is not None and self.backend != "torch":
            raise InputError(f"--weights names a published-format weights file (--backend torch); --backend "
                             f"{self.backend} takes an export directory as --model")
        check_precision_for(self.backend, self.precision, self.device)
        for kv in self.spark_conf:
            if "=" not in kv or not kv.partition("=")[0].strip():
                raise InputError(f"--spark-conf {kv!r}: give KEY=VALUE, e.g. spark.executor.memory=8g")
        if self.engine == "ray" and self.device != "cpu" and not self.num_gpus_per_worker:
            raise InputError(f"--device {self.device} with --engine ray needs --num-gpus-per-worker (e.g. 1) so "
                             f"that Ray gives each worker its own GPU")

    @property
    def backend_options(self) -> dict[str, str]:
        """The torch backend's own options (token embeddings, precision), where given."""
        return torch_options(self.precision, self.token_embeddings, self.token_vocab, self.backend)

    @property
    def request(self) -> VectorRequest:
        """What each row's vectors become (``inference.outputs``; the engine's terms)."""
        return VectorRequest(self.output, self.mix, self.gamma, False, self.pool, self.normalize, self.dtype)

    @property
    def policy(self) -> BatchPolicy:
        """How rows become model batches (windows, token budget)."""
        return BatchPolicy(self.max_sentence_length, self.window_context, self.max_tokens_per_batch)

    @property
    def context(self) -> int:
        return self.policy.context

    @property
    def input_columns(self) -> list[str]:
        """The columns read from the input, in output order (id, kept columns), then the text."""
        text = self.tokens_column or self.text_column
        cols = ([self.id_column] if self.id_column else []) + list(self.keep_columns)
        return cols + ([text] if text not in cols else [])

    @property
    def passthrough_columns(self) -> list[str]:
        return ([self.id_column] if self.id_column else []) + list(self.keep_columns)

    @classmethod
    def coerce(cls, value: "EmbedOptions | Mapping[str, Any] | None" = None, **overrides: Any) -> "EmbedOptions":
        """An EmbedOptions from an instance, a dict (e.g. from JSON) or keyword arguments."""
        base = asdict(value) if isinstance(value, EmbedOptions) else dict(value or {})
        base.update(overrides)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(base) - known)
        if unknown:
            raise InputError(f"unknown embed options {unknown}; known: {sorted(known)}")
        if base.get("keep_columns") is not None:
            base["keep_columns"] = _as_tuple(base["keep_columns"], str)
        if base.get("mix") is not None:
            base["mix"] = _as_tuple(base["mix"], float)
        if base.get("spark_conf") is not None:
            base["spark_conf"] = _as_tuple(base["spark_conf"], str)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["keep_columns"] = list(self.keep_columns)
        d["mix"] = list(self.mix) if self.mix is not None else None
        d["spark_conf"] = list(self.spark_conf)
        d["window_context"] = self.context
        return d

    def identity(self) -> dict[str, Any]:
        """The options that change the output, i.e. that a resumed job must keep. fp32, the
        precision of every job written before the option existed, is left out so that those
        jobs keep their identity; so is normalize's default (False)."""
        return {k: v for k, v in self.to_dict().items()
                if k not in RUNTIME_ONLY and not (k == "precision" and v == "fp32") and not (k == "normalize" and not v)}


def _check_columns(opts: EmbedOptions) -> None:
    """Each output column once: the id column and the kept columns name different columns."""
    names = opts.passthrough_columns
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"--keep-columns / --id-column name {repeated} more than once; each output column is "
                         f"written once: list it once")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {list(choices)}, got {value!r}")


def _as_tuple(value: Any, kind: type) -> tuple:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        return tuple(kind(v) for v in value)
    except (TypeError, ValueError):
        raise InputError(f"expected a comma-separated list of {kind.__name__}, got {value!r}") from None


def digest(obj: Any) -> str:
    """sha256 of a JSON-able object in canonical form."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

