"""What running a TensorRT engine needs, shared by the backend that runs engines and the export
that builds them: the optional imports, CUDA call checking, the GPU's identity, and the rule that
an engine runs only on the TensorRT version and GPU it was built for.

TensorRT (the optional `tensorrt` extra) and cuda-python are imported only when called.
"""
from __future__ import annotations

from typing import Any

from .errors import EngineMismatchError, TensorRTUnavailableError


def import_tensorrt():  # type: ignore[no-untyped-def]
    try:
        import tensorrt as trt  # noqa: PLC0415 - optional extra
    except ImportError:
        raise TensorRTUnavailableError("TensorRT is not installed: `pip install '.[tensorrt]'` on a machine with an "
                                       "NVIDIA GPU (its wheels come from NVIDIA's package index)") from None
    return trt


def import_cudart():  # type: ignore[no-untyped-def]
    try:  # cuda-python >= 12.6 moved the runtime bindings
        from cuda.bindings import runtime as cudart  # noqa: PLC0415
    except ImportError:
        try:
            from cuda import cudart  # noqa: PLC0415
        except ImportError:
            raise TensorRTUnavailableError("cuda-python is not installed (part of the `tensorrt` extra)") from None
    return cudart


def cuda_check(result: tuple, what: str) -> Any:  # type: ignore[type-arg]
    """cuda-python returns (error, *values); raise on an error, return the value(s)."""
    err, *values = result
    if int(err) != 0:
        raise TensorRTUnavailableError(f"CUDA {what} failed: {err}")
    return values[0] if len(values) == 1 else tuple(values)


def gpu_identity(device: int = 0) -> dict[str, Any]:
    """Name and compute capability of a CUDA device (what an engine is bound to)."""
    cudart = import_cudart()
    props = cuda_check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    return {"name": name.rstrip("\x00"), "compute_capability": f"{props.major}.{props.minor}"}


def check_engine_manifest(manifest: dict[str, Any], trt_version: str, gpu: dict[str, Any]) -> None:
    """Refuse an engine built by another TensorRT version or for another GPU (engines are not portable)."""
    built = manifest.get("tensorrt", {})
    problems = []
    if built.get("version") != trt_version:
        problems.append(f"built with TensorRT {built.get('version')}, running TensorRT {trt_version}")
    for key, label in (("name", "GPU"), ("compute_capability", "compute capability")):
        if manifest.get("gpu", {}).get(key) != gpu.get(key):
            problems.append(f"built for {label} {manifest.get('gpu', {}).get(key)!r}, this is {gpu.get(key)!r}")
    if problems:
        raise EngineMismatchError("TensorRT engine mismatch: " + "; ".join(problems)
                                  + ". Rebuild it here with `elmo export tensorrt --model ONNX_DIR --out DIR`")


def tensorrt_status() -> tuple[bool, str]:
    """(usable, reason): TensorRT imports and a CUDA device is visible."""
    try:
        trt = import_tensorrt()
        gpu = gpu_identity()
    except TensorRTUnavailableError as e:
        return False, str(e)
    return True, f"TensorRT {trt.__version__} and GPU {gpu['name']} (sm {gpu['compute_capability']}) are present"
