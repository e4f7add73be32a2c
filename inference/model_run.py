"""One resolved model run: which model runs, on which backend and device, on how many threads, in
which precision, and why each was chosen.

Every door (``elmo embed`` local, Ray and Spark, its hdf5 layout, ``elmo serve`` local and on Ray
Serve, the Triton model, ``elmo probe``, ``elmo perplexity``, ``Embedder.open``) turns what it was
asked into a ``ModelRun`` once, with ``resolve_run``, and builds its backend with ``ModelRun.open``,
in this process or in the replicas the record is sent to. Nothing downstream decides any of it
again: the precision is checked here once (``registry.check_precision_for``), ``--precision auto``
is settled here (``precision.resolve_precision``; an on-demand ONNX export measures its own,
``export.on_demand``), the CPU's bf16 is judged once (``precision.cpu_bf16``). ``describe`` is the
line a command prints once; ``to_dict`` what ``--json`` and the job's manifest record.
"""
from __future__ import annotations

import errno
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from elmo_core import ElmoConfig
from elmo_core.errors import InputError, SettingError
from storage.locations import is_uri
from runtime import CpuBudget, process_cpu_budget, threads_for

from .backends import Backend
from .batching import BatchBudget, cpu_batch_budget, gpu_budget
from .errors import ModelChangedError
from .fast_lstm import packed_products
from .layout import Layout, layout_record, resolve_layout
from .precision import SlowPrecision, bf16_cpu_warning, resolve_precision
from .registry import (backend_kind, check_device, check_precision_for, export_dir, exported_backend,
                       exported_precision, load_backend, model_config, model_files, model_identity, refuse_token_files,
                       torch_options)
from .row_shape import RowShape
from .run_settings import RunSettings

# (model directory, weights, the precision asked for (auto included), threads) -> (the export
# directory that runs, its precision, why): how the onnx backend's model directory is exported on
# demand (``export.on_demand.onnx_exporter``, handed in by the door: the exporter sits above us).
Exporter = Callable[[str, "str | None", str, int], "tuple[str, str, str]"]

# A job's own threads (reading and preparing; encoding and writing Parquet) cost about 30 us of one
# core per token (float16 encoding most). A model cheaper than about twice that on one core (under
# 6 MFLOP a token at ~100 GFLOP/s) leaves the job bound by them, and the model's threads then take
# all cores but one. Measured on 2 cores, a 0.3 MFLOP/token model, 40,000 rows in float16: 23.4k
# tokens/s with the model on 2 threads, 35.0k on 1. The full-size model (204 MFLOP) and the shipped
# small config (14 MFLOP) keep every core.
HOST_BOUND_FLOPS = 6e6



@dataclass(frozen=True)
class ModelRun:
    """What runs and why: made by ``resolve_run`` only. ``model``: a model directory or options.json
    (torch), or an export directory (onnx, tensorrt), absolute or a URI; ``source``: the model
    directory an on-demand export was made from."""

    model: str
    backend: str
    device: str
    precision: str
    precision_reason: str
    threads: CpuBudget
    weights: str | None = None
    token_embeddings: str | None = None
    token_vocab: str | None = None
    config: ElmoConfig | None = field(default=None, repr=False, compare=False)  # the architecture that runs
    source: str | None = None
    warning: SlowPrecision | None = None  # a command prints it once (and refuses a scalar one)
    layout: Layout | None = None  # how torch runs the recurrence (``inference.layout``); None for an export
    batch: BatchBudget = field(default_factory=cpu_batch_budget)  # its batches' and sort windows' tokens, and why
    expected_tokens: int | None = None  # a job's, which a compiled layout's warm-up must repay; None: no end in sight
    pin: dict | None = field(default=None, repr=False)  # the identity its files must have where it opens (a job's)
    device_checked: bool = field(default=True, repr=False)  # False: a cluster's replica checks it as it opens

    @property
    def name(self) -> str:
        """The model's name (its directory's), as a server reports it."""
        return self.model.rstrip("/").rsplit("/", 1)[-1] if is_uri(self.model) else Path(self.model).name

    def identity(self) -> dict:
        """What identifies the model that runs: its files and their sha256 (``registry.model_identity``)."""
        return model_identity(self.model, self.backend, self.weights)

    def pinned(self, identity: dict) -> "ModelRun":
        """This run, opened only where its files have ``identity`` (``open``): the record a job sends
        its replicas, each of which hashes the files once, before it loads them."""
        return replace(self, pin=identity)

    def batched(self, tokens: int | None, window_tokens: int | None, window_rows: int | None) -> "ModelRun":
        """This run with the batch budget and sort windows a job asked for where it did
        (``BatchBudget.asked``): what its line and its manifest report is what runs."""
        budget = self.batch.asked(tokens, window_tokens, window_rows)
        return self if budget is self.batch else replace(self, batch=budget)

    def describe(self) -> str:
        """The one line a command prints: ``M (torch on cpu, fp32: why; N threads: why)``."""
        source = f", exported from {self.source}" if self.source else ""
        layout = f"; {self.layout.describe()}" if self.layout else ""
        return (f"{self.model} ({self.backend} on {self.device}, {self.precision}: {self.precision_reason}{source}; "
                f"{self.threads}{layout}; {self.batch})")

    def to_dict(self) -> dict[str, Any]:
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("config", "pin", "device_checked")}
        record.update(layout_record(self.layout))
        record["threads"], record["threads_reason"] = self.threads.count, self.threads.reason
        record["batch"] = asdict(self.batch)
        record["warning"] = self.warning and self.warning.text
        return record

    def on_cpu(self) -> "ModelRun":
        """The same run on the CPU: what a driver opens to check the model (its files, what it can
        compute) where the replicas' GPUs are not visible to it, in the unmeasured ``packed`` layout
        (the check runs no job: nothing to measure or compile)."""
        return replace(self, device="cpu", layout=Layout("packed", "the driver's check") if self.layout else None)

    def on_replica(self, threads: int, reason: str) -> "ModelRun":
        """The record a replica runs where the runner gives each replica its own share of CPUs."""
        return replace(self, threads=CpuBudget(threads, reason))

    def shared(self, rows: int, total_rows: int, replicas: int) -> "ModelRun":
        """The record each of ``replicas`` runs where they share ``rows`` (the pending ones) of the
        job's ``total_rows``: its expected tokens its share, which its own warm-up must repay."""
        if self.expected_tokens is None:
            return self
        return replace(self, expected_tokens=self.expected_tokens * rows // max(total_rows, 1) // max(replicas, 1))

    def settled_layout(self) -> Layout:
        """The layout that runs: the record's, or where the run was left to a replica (``auto``),
        measured here, where the model runs."""
        if self.layout is None or self.layout.name != "auto":
            return self.layout or Layout("packed", "")
        return resolve_layout("auto", self.device, self.precision, self.config, self.threads.count,
                             tokens=self.expected_tokens)

    def open(self, **options: Any) -> Backend:
        """The backend, ready on ``device`` (``options``: the backend's own, e.g. torch's ``stateful``
        or onnx's ``providers``; ``registry.open_backend``); a pinned run's only from its pinned files
        (``open_identified``)."""
        return self.open_identified(**options)[0] if self.pin is not None else self._open(**options)

    def open_identified(self, **options: Any) -> tuple[Backend, dict]:
        """(the backend, the identity of the files it loaded): hashed once, before loading, and the
        same files (device, inode, size, mtime) once loaded. ModelChangedError where they are not
        the pinned ones, or were replaced while they loaded."""
        before = self.signature()
        identity = self.identity()
        if self.pin is not None and identity != self.pin:
            raise ModelChangedError(self._changed(identity))
        backend = self._open(**options)
        try:
            after = self.signature()
        except OSError:  # a file removed while it loaded
            after = None
        if after != before:
            backend.close()
            raise ModelChangedError(f"{self.model}: its files were replaced while they were loaded; keep the model's "
                                    f"files in place while a run uses them")
        return backend, identity

    def signature(self) -> list[tuple]:
        """Which files the model's are and when they last changed (path, device, inode, size, mtime):
        a replaced file differs, as does one rewritten in place. Not a checksum: ``identity`` is."""
        out = []
        for f in model_files(self.model, self.backend, self.weights):
            st = os.stat(f)
            out.append((str(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return out

    def _changed(self, identity: dict) -> str:
        pin = self.pin or {}
        names = {"sha256": "exported model" if backend_kind(self.backend).exported else "weights",
                 "options_sha256": "options.json"}
        what = [f"the sha256 of its {names[k]} is {str(identity.get(k))[:16]}..., recorded {str(pin.get(k))[:16]}..."
                if k in names else f"its {k} is {identity.get(k)}, recorded {pin.get(k)}"
                for k in sorted(set(identity) | set(pin)) if identity.get(k) != pin.get(k)]
        return (f"the model {self.model} is not the one recorded when the run started ({'; '.join(what)}): its "
                f"files were replaced or edited since; nothing was computed with them")

    def _open(self, **options: Any) -> Backend:
        files = {"weights": self.weights} if self.weights else {}
        if self.layout is not None:
            settled = self.settled_layout()
            files["layout"] = settled.name
            if settled.rows:
                files["rows"] = settled.rows
            if settled.onednn:
                files["onednn"] = True
        if not self.device_checked:
            check_device(self.device, self.backend)
        return load_backend(self.model, self.backend, threads=self.threads, device=self.device, **files,
                            **torch_options(self.precision, self.token_embeddings, self.token_vocab, self.backend),
                            **options)


def resolve_run(model: str | Path, settings: RunSettings | None = None, *, job: bool = False,
                remote: bool = False, exporter: Exporter | None = None, flags: frozenset[str] | None = None,
                expected_tokens: int | None = None, **asked: Any) -> ModelRun:
    """The one decision of a run, from ``settings`` (or ``asked``: ``RunSettings``' fields as keywords).
    ``backend``: None reads it from an export directory (else torch); ``precision``: None is the
    backend's default (an export's own), ``auto`` the fastest that holds parity on the CPU whose
    ``flags`` are given (default: this one's); ``job``: an ``elmo embed`` job, whose own readers and
    writers share the CPUs (``default_threads``); ``remote``: the model runs in replicas on a cluster
    (Ray, Spark), whose devices this process may not see, on ``threads`` each (default one; the runner
    may give each its share, ``ModelRun.on_replica``); ``expected_tokens``: a job's (its input files'
    ``pipelines.source.InputFile.expected_tokens``), which a compiled layout's warm-up must repay
    (None: a run with no end in sight, a server's). InputError (or BackendUnavailableError) for what cannot run."""
    s = _settings(model, settings, asked)
    backend, device, threads, precision, weights, layout = s.backend, s.device, s.threads, s.precision, s.weights, \
        s.layout
    model = _where(os.fspath(model), "model")
    backend = backend or exported_backend(model) or "torch"
    kind = backend_kind(backend)
    if kind.exported:
        _refuse_torch_settings(backend, weights, layout)  # before an export is built on demand
    refuse_token_files(backend, s.token_embeddings, s.token_vocab)
    if not remote:
        check_device(device, backend)
    named = None if precision in (None, "auto") else check_precision_for(backend, precision, device)  # named first
    own = exported_precision(model, backend) if kind.exported else None  # an export's precision (its manifest)
    on_demand = kind.exports_on_demand and exporter is not None and own is None
    config = model_config(model, "torch" if on_demand else backend, weights)  # an unreadable model fails here
    budget = _threads(config, device, threads, job, remote)
    source = None
    if kind.exported:
        name, why, exported = _exported_precision(model, backend, own, precision, weights, budget, exporter)
        if exported != model:
            model, source, weights = exported, model, None
            config = model_config(model, backend)
    else:
        name, why = _torch_precision(precision, device, flags, config, remote)
    checked = named if named is not None and named.name == name else check_precision_for(backend, name, device)
    warning = None if kind.exported else bf16_cpu_warning(checked.name, device, flags)
    settled = _layout(layout, kind.exported, device, checked.name, config, budget, remote, expected_tokens)
    return ModelRun(model, backend, device, checked.name, why, budget, _where(weights, "weights"),
                    _where(s.token_embeddings, "token_embeddings"), _where(s.token_vocab, "token_vocab"), config, source,
                    warning, settled, _batch_budget(device, config, remote, settled),
                    expected_tokens=expected_tokens, device_checked=not remote)


def _settings(model: object, settings: object, asked: dict) -> RunSettings:
    """``resolve_run``'s settings, from a RunSettings or its fields as keywords (not both); InputError
    for either of another type, and for a model that is no path."""
    if settings is not None and (asked or not isinstance(settings, RunSettings)):
        given = "both" if asked else type(settings).__name__
        raise InputError(f"resolve_run takes a RunSettings or its fields as keywords, not {given}: give one")
    if not isinstance(model, (str, os.PathLike)):
        raise InputError(f"model must be a path (a model or export directory, options.json) or a URI, got "
                         f"{type(model).__name__} {model!r}")
    return settings if settings is not None else RunSettings(**asked)


def _refuse_torch_settings(backend: str, weights: str | Path | None, layout: str | None) -> None:
    """InputError for the torch backend's own settings given to an exported one."""
    if weights:
        raise InputError(f"--weights names a published-format weights file (--backend torch); --backend {backend} "
                         f"takes an export directory as --model")
    if layout not in (None, "auto"):
        raise InputError(f"--layout {layout} is how the torch backend runs the recurrence; an export runs "
                         f"its own graph (leave --layout out)")


def _torch_precision(precision: str | None, device: str, flags: frozenset[str] | None, config: ElmoConfig,
                     remote: bool) -> tuple[str, str]:
    """The torch backend's precision and the reason given for it (``resolve_precision``)."""
    name, why = resolve_precision(precision or _default_precision(device), device, flags, packed_products(config))
    if precision is None:
        why = f"the default{' on CUDA, ' + why if device.startswith('cuda') else ''}"
    elif remote and flags is not None and precision == "auto":
        why = f"judged by a worker's CPU: {why}"
    return name, why


def _layout(layout: str | None, exported: bool, device: str, precision: str, config: ElmoConfig,
            budget: CpuBudget, remote: bool, tokens: int | None) -> Layout | None:
    """The torch backend's layout and why (None for an export, whose graph is its own); ``auto`` on a
    cluster's CPUs is left to each replica (``ModelRun.settled_layout``), measured where it runs."""
    if exported:
        return None  # an asked layout was refused by resolve_run
    if remote and layout in (None, "auto") and not device.startswith("cuda"):
        return Layout("auto", "measured where each replica runs")
    return resolve_layout(layout, device, precision, config, budget.count, tokens=tokens)


def _default_precision(device: str) -> str:
    """The torch backend's precision when none is asked: ``auto`` on CUDA (bf16 on the tensor cores,
    within the parity bound), fp32 on a CPU (bf16 pays there only where measured: ``--precision auto``)."""
    return "auto" if device.startswith("cuda") else "fp32"


def _batch_budget(device: str, config: ElmoConfig, remote: bool,
                  layout: Layout | None) -> BatchBudget:
    """The run's batch and sort-window tokens (``inference.batching``): a CPU's, or sized to the
    GPU's memory where this process sees it (a cluster's replicas' GPUs are not: the smallest
    data-centre card's budget, 40 GB); batches planned for the static rows where ``layout`` is rows."""
    ls = config.lstm
    if not device.startswith("cuda"):
        return cpu_batch_budget(ls.dim, ls.projection_dim, ls.n_layers)
    rows = RowShape().rows if layout is not None and layout.name == "rows" else None
    if remote:
        budget = gpu_budget(40 << 30, ls.dim, ls.projection_dim, ls.n_layers, "", rows)
        return replace(budget, reason="a replica's GPU, not visible here: sized for a 40 GB card (--max-batch-tokens "
                                      "sets it)")
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return gpu_budget(props.total_memory, ls.dim, ls.projection_dim, ls.n_layers, props.name, rows)


def _where(path: str | Path | None, name: str) -> str | None:
    """A local path made absolute (a replica's working directory differs); a URI as given. ``name``:
    the setting it is (``model``, ``weights``, ...), named where the path cannot be resolved."""
    if path is None:
        return None
    if is_uri(path):
        return str(path)
    try:
        return str(Path(path).resolve())
    except (RuntimeError, OSError) as e:  # a symlink loop: RuntimeError before Python 3.13, OSError ELOOP after
        loop = isinstance(e, RuntimeError) or e.errno == errno.ELOOP
        why = "its symbolic links form a loop" if loop else (e.strerror or str(e))
        raise SettingError(f"`{name}` {path} cannot be resolved: {why}; give the file's or directory's real "
                           f"path") from None


def _threads(config: ElmoConfig, device: str, threads: int | None, job: bool, remote: bool) -> CpuBudget:
    if threads:
        return threads_for(threads)
    if remote:
        return CpuBudget(1, "one per replica (the default; --threads gives each more)")
    if job:
        return default_threads(config, device)
    return process_cpu_budget()


def default_threads(config: ElmoConfig, device: str) -> CpuBudget:
    """A job's model threads when --threads is not given: the CPUs this process is given
    (``runtime.cpus``) for a model whose compute dominates the job on the CPU; all of them but one
    otherwise (and on a GPU)."""
    budget = process_cpu_budget()
    if (device == "cpu" and config.flops_per_token >= HOST_BOUND_FLOPS) or budget.count == 1:
        return budget
    why = "a small model" if device == "cpu" else "a GPU job"
    return CpuBudget(budget.count - 1, f"{budget.reason}, one left to the job's readers and writers ({why})")


def _exported_precision(model: str, backend: str, exported: str | None, asked: str | None,
                        weights: str | Path | None, budget: CpuBudget,
                        exporter: Exporter | None) -> tuple[str, str, str]:
    """(precision, why, the export that runs) for the onnx and tensorrt backends: an export runs its own
    precision (``exported``); a model directory is exported on demand by ``exporter`` where the backend
    allows it."""
    if exported is not None:
        if asked not in (None, "auto", exported):
            raise InputError(f"--model {model} is an {exported} {backend_kind(backend).title} export; for "
                             f"--precision {asked} pass the "
                             f"model directory it came from (exported on demand), or run "
                             f"`elmo export {backend} --precision {asked}`")
        return exported, "the export's precision", str(export_dir(model, backend))
    if not backend_kind(backend).exports_on_demand or exporter is None:
        return asked if asked not in (None, "auto") else "fp32", "asked for", model  # open() names what is missing
    target, name, why = exporter(model, None if weights is None else str(weights), asked or "fp32", budget.count)
    return name, why, target
