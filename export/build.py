"""`make engine` / `elmo engine`: a model exported, validated, and built into the fastest runtime
artifact this machine can run.

TensorRT when the `tensorrt` extra imports and a CUDA GPU answers; otherwise the ONNX Runtime
model optimized for CUDA (onnxruntime-gpu and a GPU), else for the CPU (cached by the ONNX backend
beside the export). The report says which and why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from elmo_core.names import TENSORRT_PRECISIONS
from formats.errors import ExportError
from inference.onnx_backend import CACHE_DIR, OnnxBackend, cuda_provider_status
from inference.tensorrt_runtime import tensorrt_status

from .onnx_export import export_onnx
from .tensorrt import build_engine


def _optimized(onnx_dir: Path, provider: str, threads: int | None) -> str:
    """Load the export on ``provider`` (which optimizes it and caches the result); the cached model's path."""
    backend = OnnxBackend(onnx_dir, providers=[provider], threads=threads)
    cached = backend.optimized_path or next((onnx_dir / CACHE_DIR).glob("model.all.*.onnx"), None)
    backend.close()
    return str(cached or onnx_dir / "model.onnx")


def build_for_machine(model_dir: str | Path, out: str | Path, precision: str = "fp32",
                      threads: int | None = None, weights: str | Path | None = None) -> dict[str, Any]:
    """Export + validate, then build TensorRT, else the ONNX Runtime model optimized for CUDA, else for
    the CPU. Returns a report: what was built (``artifact``), where (``path``), and ``why``; the
    directory to pass as ``--model`` with ``--backend`` (``model``, ``backend``).
    """
    out = Path(out)
    onnx_dir = out / ("onnx" if precision == "fp32" else f"onnx-{precision}")
    usable, reason = tensorrt_status()
    for_tensorrt = usable and precision in TENSORRT_PRECISIONS
    cuda, cuda_reason = cuda_provider_status()  # present; whether a GPU answers shows when it loads
    # A CPU-only graph may run the char-CNN once per distinct token (Unique, a CPU kernel in ONNX Runtime).
    manifest = export_onnx(model_dir, onnx_dir, precision=precision, threads=threads, weights=weights,
                           token_dedup=not (for_tensorrt or cuda))
    par = manifest["parity"]
    validated = f"ONNX validated against torch (max |diff| {par['max_abs']:.1e}, min cosine {par['min_cosine']:.6f})"
    if for_tensorrt:
        m = build_engine(onnx_dir, out / "tensorrt")
        return {"artifact": f"TensorRT {precision} engine", "backend": "tensorrt", "model": str(out / "tensorrt"), "path": str(out / "tensorrt" / m["engine"]["file"]),
                "why": f"{reason}; {validated}", "onnx": str(onnx_dir)}
    if usable:
        reason = f"{reason}, but a {precision} graph is ONNX Runtime-only (TensorRT takes {'/'.join(TENSORRT_PRECISIONS)} exports)"
    provider, path = "CUDAExecutionProvider", None
    if cuda:
        try:
            path = _optimized(onnx_dir, provider, threads)
        except ExportError as e:  # onnxruntime-gpu without a usable GPU: say so, build for the CPU
            cuda_reason = str(e)
    if path is None:
        provider, path = "CPUExecutionProvider", _optimized(onnx_dir, "CPUExecutionProvider", threads)
        cuda_reason = f"no CUDA: {cuda_reason}"
    return {"artifact": f"ONNX Runtime optimized {precision} model ({provider}, level all)", "backend": "onnx",
            "model": str(onnx_dir), "path": path,
            "why": f"no TensorRT: {reason}; {cuda_reason}; {validated}", "onnx": str(onnx_dir)}
