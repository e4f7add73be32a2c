"""Opening the backend a job asked for, and the identity (sha256) of the model it runs.

The torch backend is always there. The ONNX Runtime and TensorRT backends live in
``inference.onnx_backend`` / ``inference.tensorrt_backend`` and are imported only when asked for,
so a machine without onnxruntime-gpu or TensorRT can still run the torch backend.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from elmo_core.errors import InputError, WeightsError
from elmo_core.model_io import file_sha256, resolve_model
from inference.backends import Backend, TorchBackend

# backend name -> (module, class, the file its export directory holds)
EXPORTED = {
    "onnx": ("inference.onnx_backend", "OnnxBackend", "model.onnx"),
    "tensorrt": ("inference.tensorrt_backend", "TensorRTBackend", "model.engine"),
}


class BackendUnavailableError(InputError):
    """The backend asked for is not installed or not built on this branch."""


def _exported_class(backend: str) -> type:
    module_name, class_name, _ = EXPORTED[backend]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise BackendUnavailableError(
            f"--backend {backend}: {module_name} cannot be imported ({e}); install the '{backend}' support "
            f"(pip install -e '.[gpu]' / '.[tensorrt]') or use --backend torch") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise BackendUnavailableError(f"--backend {backend}: {module_name} has no {class_name}")
    return cls


def _exported_file(model: Path, backend: str) -> Path:
    name = EXPORTED[backend][2]
    if model.is_file():
        return model
    found = model / name
    if not found.is_file():
        candidates = sorted(model.glob("*" + Path(name).suffix)) if model.is_dir() else []
        if len(candidates) != 1:
            raise WeightsError(f"{model}: --backend {backend} needs an export directory holding {name}")
        found = candidates[0]
    return found


def check_device(device: str, backend: str = "torch") -> None:
    """Refuse --device cuda where the backend cannot reach a GPU (before a job claims its output directory)."""
    if device == "cpu" or backend == "tensorrt":  # TensorRT engines always run on the GPU
        return
    if backend == "onnx":
        from inference.onnx_backend import cuda_provider_status

        present, reason = cuda_provider_status()
        if not present:
            raise BackendUnavailableError(f"--device {device}: {reason}")
        return
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"--device {device}: torch sees no CUDA GPU here (torch {torch.__version__}); "
                                      f"use --device cpu")


def onnx_providers(device: str) -> list:  # type: ignore[type-arg]
    """ONNX Runtime providers for a --device: the CPU, or CUDA on GPU N (our CUDA defaults apply)."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)})]


def open_backend(model: str | Path, backend: str = "torch", threads: int | None = None,
                 device: str = "cpu") -> Backend:
    """A ready backend. ``model``: a published-format directory (torch) or an export directory.

    ``device``: cpu, cuda or cuda:N for the torch and ONNX Runtime backends (TensorRT is always GPU 0's).
    """
    model = Path(model)
    if backend == "torch":
        check_device(device, backend)
        return TorchBackend.from_files(model, threads=threads, device=device)
    if backend not in EXPORTED:
        raise InputError(f"unknown backend {backend!r}; use one of ['torch', {', '.join(map(repr, EXPORTED))}]")
    cls = _exported_class(backend)
    _exported_file(model, backend)  # a clear error before the backend's own
    return cls(model, threads=threads, providers=onnx_providers(device)) if backend == "onnx" else cls(model)


def model_identity(model: str | Path, backend: str = "torch") -> dict:
    """What identifies the model of a job: its files and their sha256."""
    model = Path(model)
    if backend == "torch":
        files = resolve_model(model)
        return {"path": str(model.resolve()), "format": files.format,
                "sha256": file_sha256(files.weights), "options_sha256": file_sha256(files.options)}
    if backend not in EXPORTED:
        raise InputError(f"unknown backend {backend!r}")
    path = _exported_file(model, backend)
    return {"path": str(model.resolve()), "format": backend, "sha256": file_sha256(path)}
