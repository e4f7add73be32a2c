"""The one registry of backends: their names, how each is opened on a device, and what identifies
the model it runs.

``Embedder.from_*``, ``elmo embed`` (both runners) and the servers open backends only here. The
torch backend is always there; the ONNX Runtime and TensorRT backends are imported only when
asked for, so a machine without onnxruntime-gpu or TensorRT still runs the torch backend.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from elmo_core import ElmoConfig, InputError
from storage.atomic import read_json_object
from elmo_core.kinds import Precision
from elmo_core.names import EXPORT_PRECISIONS
from storage.locations import file_sha256, is_uri, local_copy

from .errors import BackendUnavailableError
from formats.export_manifest import ENGINE_NAME, MANIFEST_NAME, ONNX_NAME, read_manifest

if TYPE_CHECKING:  # the names and checks here are read by the CLI's parsers without the model code
    from .backends import Backend


@dataclass(frozen=True)
class BackendKind:
    """One backend: where its class lives and what its model argument is."""

    name: str
    module: str
    class_name: str
    artifact: str | None  # the file an export directory holds; None: a published-format model
    install: str  # what to install when its module cannot be imported
    exports_on_demand: bool = False  # a model directory is exported once, validated and cached (export.cache)
    gpu_only: bool = False  # its engines always run on the GPU
    title: str = ""  # its name in a sentence (its export's format)

    @property
    def exported(self) -> bool:
        """It runs an export (its precision the export's); else a published-format model, whose
        products run in the precision asked for (``inference.precision``)."""
        return self.artifact is not None


BACKENDS = {k.name: k for k in (
    BackendKind("torch", "inference.backends", "TorchBackend", None, "the base package", title="torch"),
    BackendKind("onnx", "inference.onnx_backend", "OnnxBackend", ONNX_NAME,
                "onnxruntime (base package; the `gpu` extra for CUDA)", exports_on_demand=True, title="ONNX"),
    BackendKind("tensorrt", "inference.tensorrt_backend", "TensorRTBackend", ENGINE_NAME,
                "the `tensorrt` extra, on a machine with an NVIDIA GPU", gpu_only=True, title="TensorRT"),
)}
BACKEND_NAMES = tuple(BACKENDS)


def backend_kind(name: str) -> BackendKind:
    if name not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {name!r}; use one of {list(BACKEND_NAMES)}")
    return BACKENDS[name]


def _backend_class(kind: BackendKind) -> type:
    try:
        module = importlib.import_module(kind.module)
    except ImportError as e:
        raise BackendUnavailableError(f"backend {kind.name}: {kind.module} cannot be imported ({e}); "
                                      f"install {kind.install}, or use the torch backend") from None
    return getattr(module, kind.class_name)


def export_dir(model: str | Path, backend: str) -> Path:
    """The export directory a user means: the directory itself; a file in it (``.ort_cache``'s
    optimized model included: ``elmo engine`` prints that path); or ``elmo engine``'s OUT, which
    holds one export of this kind (OUT/onnx, OUT/tensorrt). Anything else is returned unchanged,
    for ``artifact_file`` to name what is missing. A URI is fetched once into the local cache."""
    path = local_copy(model) if is_uri(model) else Path(model)
    if path.is_file():
        parent = path.parent.parent if path.parent.name.startswith(".") else path.parent
        return parent if _manifest_kind(parent) == backend else path
    if path.is_dir() and _manifest_kind(path) is None:
        found = [d for d in sorted(path.iterdir()) if d.is_dir() and _manifest_kind(d) == backend]
        if len(found) > 1:
            raise BackendUnavailableError(f"{path} holds {len(found)} {backend} exports "
                                          f"({', '.join(d.name for d in found)}); pass one of them as --model")
        if found:
            return found[0]
    return path


def _manifest_kind(directory: Path) -> str | None:
    try:
        return read_json_object(directory / MANIFEST_NAME).get("kind")
    except (OSError, InputError):
        return None


def artifact_file(model: str | Path, backend: str) -> Path:
    """The exported file an ONNX / TensorRT backend runs: ``model`` itself, or the one its directory holds."""
    kind, model = backend_kind(backend), Path(model)
    if kind.artifact is None or model.is_file():
        return model
    found = model / kind.artifact
    if not found.is_file():
        candidates = sorted(model.glob("*" + Path(kind.artifact).suffix)) if model.is_dir() else []
        if len(candidates) != 1:
            raise BackendUnavailableError(f"{model}: backend {backend} needs an export directory holding "
                                          f"{kind.artifact} (`elmo export {backend}`)")
        found = candidates[0]
    return found


def check_device(device: str, backend: str = "torch") -> None:
    """Refuse a GPU device the backend cannot reach (callers check before they write anything)."""
    if device == "cpu" or backend_kind(backend).gpu_only:
        return
    if backend == "onnx":
        from .onnx_backend import cuda_provider_status

        present, reason = cuda_provider_status()
        if not present:
            raise BackendUnavailableError(f"--device {device}: {reason}")
        return
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"--device {device}: torch sees no CUDA GPU here (torch {torch.__version__}); "
                                      f"use --device cpu")
    index, count = torch.device(device).index, torch.cuda.device_count()
    if index is not None and index >= count:
        raise BackendUnavailableError(f"--device {device}: this process sees {count} GPU{'s' if count != 1 else ''} "
                                      f"(cuda:0 to cuda:{count - 1}; CUDA_VISIBLE_DEVICES hides others)")


def torch_options(precision: str = "fp32", token_embeddings: str | None = None,
                  token_vocab: str | None = None, backend: str = "torch") -> dict[str, Any]:
    """The torch backend's own ``open_backend`` options: its precision, as the record the run
    resolved (``check_precision_for``), which the backend reads without checking it again, and a
    token-embedding file where given. Another backend's precision is its export's: left out."""
    options: dict[str, Any] = {} if backend_kind(backend).exported else {"precision": Precision.of(precision)}
    if token_embeddings is not None or token_vocab is not None:
        options.update(token_embeddings=token_embeddings, token_vocab=token_vocab)
    return options


def check_precision_for(backend: str, precision: str, device: str) -> Precision:
    """The one check of a run's precision, where it is resolved: refuse a precision the backend does
    not take or the device cannot run (tf32 off CUDA). An ONNX or TensorRT model runs its export's
    precision (``exported_precision``)."""
    kind = Precision.ALL.get(precision)
    if backend_kind(backend).exported:
        if kind is None or not kind.exported:
            raise InputError(f"--precision {precision}: an {backend} model runs its export's precision, "
                             f"one of {list(EXPORT_PRECISIONS)}")
        return kind
    if kind is not None and kind.exported and not kind.torch_backend:
        raise InputError(f"--precision {precision} runs on the onnx backend (ONNX Runtime's quantized model): "
                         f"add --backend onnx")
    from .precision import check_precision

    return check_precision(precision, "cuda" if device.startswith("cuda") else "cpu")


def exported_precision(model: str | Path, backend: str) -> str | None:
    """The precision of the export ``model`` names for ``backend``; None where ``model`` is not one
    (a model directory, which the onnx backend exports on demand: ``export.cache``)."""
    if backend_kind(backend).artifact is None:
        return None
    path = export_dir(model, backend)
    if _manifest_kind(path) != backend:
        return None
    return str(read_manifest(path, backend).get("precision", "fp32"))


def onnx_providers(device: str) -> list:  # type: ignore[type-arg]
    """ONNX Runtime providers for a device: the CPU, or CUDA on GPU N (our CUDA defaults apply)."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)})]


def open_backend(model: str | Path, backend: str = "torch", *, threads: int | None = None, device: str = "cpu",
                 weights: str | Path | None = None, providers: Sequence[Any] | None = None,
                 **options: Any) -> Backend:
    """A ready backend on ``device`` (cpu, cuda or cuda:N; TensorRT engines run on GPU 0).

    ``model``: a published-format directory or options.json (+ ``weights``) for torch; an export
    directory for onnx / tensorrt. ``providers`` (onnx) overrides the ones ``device`` implies;
    ``options`` go to the backend's constructor (torch: ``stateful``, ``token_cache``; onnx:
    ``optimization``, ``cache``).
    """
    refuse_token_files(backend, options.get("token_embeddings"), options.get("token_vocab"))
    if providers is None:
        check_device(device, backend)
    return load_backend(model, backend, threads=threads, device=device, weights=weights, providers=providers,
                        **options)


def refuse_token_files(backend: str, token_embeddings: Any, token_vocab: Any) -> None:
    """InputError for a token-embedding file given to a backend that runs an export (its graph holds
    the char-CNN)."""
    if backend_kind(backend).exported and (token_embeddings or token_vocab):
        raise InputError(f"token embeddings are used by the torch backend only; the {backend} backend runs "
                         f"the char-CNN inside its graph (leave --token-embeddings out, or use --backend torch)")


def load_backend(model: str | Path, backend: str = "torch", *, threads: Any = None, device: str = "cpu",
                 weights: str | Path | None = None, providers: Sequence[Any] | None = None,
                 **options: Any) -> Backend:
    """``open_backend`` for a run whose settings were checked where it was resolved
    (``inference.model_run.ModelRun``): the backend, loaded, nothing checked again. ``threads``: a
    count, or the run's ``CpuBudget``."""
    kind = backend_kind(backend)
    cls = _backend_class(kind)
    if backend == "torch":
        return cls.from_files(model, weights, threads=threads, device=device, **options)
    model = export_dir(model, backend)
    artifact_file(model, backend)  # a clear error before the backend's own
    if backend == "onnx":
        return cls(model, providers=list(providers) if providers is not None else onnx_providers(device),
                   threads=getattr(threads, "count", threads), **options)
    return cls(model, **options)


def exported_backend(model: str | Path) -> str | None:
    """The backend a local export directory is for (its manifest's kind; for ``elmo engine``'s OUT,
    the one kind of export it holds); None for anything else (a model directory, a URI)."""
    if is_uri(model) or not Path(model).is_dir():
        return None
    path = Path(model)
    kinds = {_manifest_kind(path)} - {None} or {_manifest_kind(d) for d in path.iterdir() if d.is_dir()} - {None}
    if (path / "options.json").is_file() or len(kinds) != 1:
        return None
    kind = kinds.pop()
    return kind if kind in BACKENDS and BACKENDS[kind].artifact is not None else None


def model_config(model: str | Path, backend: str = "torch", weights: str | Path | None = None) -> ElmoConfig:
    """The architecture a backend would run, read without loading the model."""
    if backend_kind(backend).artifact is None:
        kind = exported_backend(model)
        if kind is not None:
            raise InputError(f"{model}: an {kind} export, which the {backend} backend cannot run; add --backend {kind} "
                             f"(or leave --backend out: it is read from the directory)")
        from formats.model_files import resolve_model

        return ElmoConfig.from_json(resolve_model(model, weights).options)
    model = export_dir(model, backend)
    manifest = read_manifest(model, backend)
    return ElmoConfig.from_dict(manifest["source"]["architecture"], f"{model}: manifest architecture")


def model_identity(model: str | Path, backend: str = "torch", weights: str | Path | None = None) -> dict:
    """What identifies the model a backend runs: its files and their sha256 (and where it came from)."""
    where = str(model) if is_uri(model) else str(Path(model).resolve())
    if backend_kind(backend).artifact is None:
        from formats.model_files import resolve_model

        files = resolve_model(model, weights)
        found = files.dictionaries()  # only where there are: a byte-level model's identity is as it was
        return {"path": where, "format": files.format, "sha256": file_sha256(files.weights),
                "options_sha256": file_sha256(files.options),
                **({"dictionaries_sha256": {p.name: file_sha256(p) if p.is_file() else None for p in found}}
                   if found else {})}
    return {"path": where, "format": backend, "sha256": file_sha256(model_files(model, backend)[0])}


def model_files(model: str | Path, backend: str = "torch", weights: str | Path | None = None) -> list[Path]:
    """The local files ``model_identity`` hashes (a URI's local copy): the weights and options.json of a
    published-format model, the exported file of an export."""
    if backend_kind(backend).artifact is None:
        from formats.model_files import resolve_model

        files = resolve_model(model, weights)
        return [Path(files.weights), Path(files.options), *(p for p in files.dictionaries() if p.is_file())]
    return [artifact_file(export_dir(model, backend), backend)]
