"""An existing OUTPUT_DIR judged before any model code loads: a running job's lock, files that are
no job's, a damaged job record, and, where the job's identity is known without the model, the
whole claim (``claim.check_claim``): this job's output without ``--resume``, another job's output.

The job's identity is its inputs, its model (the sha256 of the model's files,
``inference.registry.model_identity``, which hashes without loading) and its output options, of
which the run settles two: the backend and the precision. Both are known here for the torch
backend on a model directory in fp32 (the default on a CPU); a URI, an export or an on-demand
export (their precision is the export's), ``--precision auto`` or another precision (checked
against the device by the model code) leave the comparison to ``plan_job``, after the run is
resolved, where it is made in every case.

With ``--resume`` the claim is compared once the model loaded (its files hashed once, as they
load); what is judged here is the columns of the shards resumed (``claim.check_columns``), where
their types are known without the model: a local model directory's options.json gives the vectors'
width and layers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow as pa

from elmo_core.config import ElmoConfig
from elmo_core.errors import ElmoError, InputError
from formats.model_files import resolve_model
from storage.atomic import digest
from storage.locations import file_sha256, is_uri
from inference.registry import backend_kind, exported_backend, model_identity
from inference.run_settings import RunSettings

from .claim import check_claim, check_columns, job_record
from .options import EmbedOptions, output_options
from .schema import output_schema
from .shard_size import settle_rows_per_shard
from .sink import Output
from .source import InputFile

if TYPE_CHECKING:
    from inference.model_run import ModelRun

DEFAULT_SETTINGS = RunSettings()


def check_output_first(out: Output, maker: "RunMaker", opts: EmbedOptions, files: list[InputFile],
                       kept: tuple[int, str] | None, passthrough: pa.Schema) -> None:
    """OutputDirError (or the lock's error) for an existing OUTPUT_DIR this job may not claim, as far
    as it is decided without the model; ``plan_job`` checks the claim again once the model loaded.
    ``kept``: the rows per shard no engine chooses (``shard_size.kept_rows_per_shard``);
    ``passthrough``: the input columns the shards keep (``source.passthrough_schema``)."""
    if not out.exists():
        return
    out.lock().check_free()  # a running job's first: what it holds is its own business
    _, found, theirs = job_record(out)
    if found is None:
        return  # new or empty: nothing to compare
    if opts.resume:
        _check_resumed_columns(out, theirs, maker, opts, files, passthrough)
        return
    identity = foreseen_identity(maker, opts, files, kept)
    if identity is not None:
        check_claim(out, identity, digest(identity), opts.resume)


# the options that change no column type (the run's two, the shard size): a job that differs only in
# them holds this job's columns, and is this job or another's by its model, compared once it loaded
_NOT_COLUMNS = ("backend", "precision", "rows_per_shard")


def _check_resumed_columns(out: Output, theirs: dict, maker: "RunMaker", opts: EmbedOptions,
                           files: list[InputFile], passthrough: pa.Schema) -> None:
    """--resume: OtherJobError where the shards hold other columns than this run would write, judged
    where the claim can only resume or refuse and a column differs because an earlier version wrote
    it: a job record whose inputs, options and model options.json are this job's (not one stopped on
    an input error whose inputs were fixed since, which restarts, its shards dropped)."""
    foreseen = _foreseen_architecture(maker)
    model = theirs.get("model")
    if foreseen is None or not isinstance(model, dict) or model.get("options_sha256") != foreseen[1]:
        return
    recorded = theirs.get("options")
    if not isinstance(recorded, dict) or theirs.get("inputs") != [f.identity() for f in files] \
            or _column_options(recorded) != _column_options(opts.to_dict()):
        return
    config = foreseen[0]
    schema = output_schema(passthrough, config.output_dim, config.n_output_layers, opts.vectors, opts.vector_layout)
    check_columns(out, opts.shard_format, schema)


def _column_options(options: dict) -> dict:
    return {k: v for k, v in output_options(options).items() if k not in _NOT_COLUMNS}


def _foreseen_architecture(maker: "RunMaker") -> tuple[ElmoConfig, str] | None:
    """(the architecture, its options.json's sha256) of a local model directory the torch backend
    runs, read without loading the weights; None where only the run knows (a URI, an export)."""
    path, settings = maker.model_path, maker.settings
    if is_uri(path) or backend_kind(settings.backend or exported_backend(path) or "torch").exported:
        return None
    try:
        options = resolve_model(path, settings.weights).options
        return ElmoConfig.from_json(options), file_sha256(options)
    except (ElmoError, OSError):
        return None  # the run reports what is wrong with the model


def foreseen_identity(maker: "RunMaker", opts: EmbedOptions, files: list[InputFile],
                      kept: tuple[int, str] | None) -> dict | None:
    """The identity ``plan_job`` gives the job once its run is resolved and its model loaded, where
    it is known without them; else None."""
    settled = _settled_model(maker)
    if settled is None or (opts.engine != "local" and opts.rows_per_shard is None):  # a cluster's slots decide
        return None
    backend, precision, model_id = settled
    rows, _ = settle_rows_per_shard(opts, files, kept)
    return job_identity(files, model_id, opts.identity(backend, precision, rows_per_shard=rows))


def job_identity(files: list[InputFile], model_id: dict, options: dict) -> dict:
    """What a job is (its claim on OUTPUT_DIR): its inputs, its model and the options that change its
    output (``EmbedOptions.identity``)."""
    return {"inputs": [f.identity() for f in files], "model": model_id, "options": options}


def _settled_model(maker: "RunMaker") -> tuple[str, str, dict] | None:
    """(backend, precision, the model's identity) the run will settle, or None where only the run knows."""
    path, settings = maker.model_path, maker.settings
    if is_uri(path) or settings.device != "cpu":
        return None
    backend = settings.backend or exported_backend(path) or "torch"
    if backend_kind(backend).exported:
        return None
    precision = settings.precision or "fp32"  # the torch backend's default on a CPU
    if precision != "fp32":
        return None
    try:
        return backend, precision, model_identity(path, backend, settings.weights)
    except (ElmoError, OSError):
        return None  # the run reports what is wrong with the model


@dataclass(frozen=True)
class RunMaker:
    """What makes the job's ``ModelRun`` once the checks that need no model pass (the CLI's resolves
    it with its exporter and prints its warnings): the model path and the run's settings, which
    ``check_output_first`` reads, and ``make(flags, tokens)``, ``flags``: the CPU flags of the machine
    the model runs on where it is not this one (a cluster's workers; None: this one), ``tokens``: the
    job's expected tokens (its files' ``source.InputFile.expected_tokens``; None: unknown)."""

    model_path: str
    settings: RunSettings
    make: Callable[[frozenset[str] | None, int | None], "ModelRun"]

    def __call__(self, flags: frozenset[str] | None = None, tokens: int | None = None) -> "ModelRun":
        return self.make(flags, tokens)

    @classmethod
    def of(cls, model: "ModelRun | RunMaker | str | Path", settings: RunSettings, remote: bool) -> "RunMaker":
        """The job's maker from what a library caller gave: a model path (resolved with ``settings``),
        a ``ModelRun`` (used as it is: ``settings`` must then be the defaults) or a maker."""
        from inference.model_run import ModelRun, resolve_run

        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            return cls(path, settings, lambda flags, tokens: resolve_run(path, settings, job=True, remote=remote,
                                                                         flags=flags, expected_tokens=tokens))
        if not isinstance(model, (ModelRun, RunMaker)):
            raise InputError(f"model must be a path, a ModelRun or a RunMaker, got {type(model).__name__} {model!r}")
        given = sorted(k for k, v in settings.to_dict().items() if v != getattr(DEFAULT_SETTINGS, k))
        if given:
            raise InputError(f"{given}: the run's settings; a ModelRun (or RunMaker) carries its own: give them to "
                             f"resolve_run, or pass the model's path")
        if isinstance(model, RunMaker):
            return model
        settled = RunSettings(model.backend, model.device, precision=model.precision, weights=model.weights)
        return cls(model.model, settled, lambda flags, tokens: model)
