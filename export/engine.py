"""`make engine` / `elmo engine`: a model (given or trained), exported, validated, and the best engine here.

TensorRT when the `tensorrt` extra imports and a CUDA GPU answers; otherwise the optimized ONNX
Runtime model (cached by the ONNX backend beside the export). The report says which and why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ExportError, TensorRTUnavailableError


def tensorrt_status() -> tuple[bool, str]:
    """(usable, reason): TensorRT imports and a CUDA device is visible."""
    from .tensorrt import gpu_identity, import_tensorrt

    try:
        trt = import_tensorrt()
        gpu = gpu_identity()
    except TensorRTUnavailableError as e:
        return False, str(e)
    return True, f"TensorRT {trt.__version__} and GPU {gpu['name']} (sm {gpu['compute_capability']}) are present"


def train_default_model(work: Path, minutes: float) -> Path:
    """Train the default model with `elmo train` on the default corpus; its model directory."""
    from elmo_cli.main import COMMAND_MODULES, main

    if "training.cli" not in COMMAND_MODULES:  # `elmo train` and `elmo sotu-corpus` live there
        raise ExportError("no --model/MODEL given and this build has no `elmo train` (the training package); "
                          "pass MODEL=DIR with a published-format model (options.json + weights)")
    corpus, run = work / "corpus", work / "train"
    for argv in (["sotu-corpus", str(corpus)],
                 ["train", "--train", str(corpus / "train"), "--valid", str(corpus / "valid"), "--out", str(run),
                  "--max-minutes", str(minutes)]):
        print("elmo " + " ".join(argv), flush=True)
        if main(argv) != 0:
            raise ExportError(f"`elmo {' '.join(argv)}` failed; see its message above")
    if not (run / "model").is_dir():
        raise ExportError(f"`elmo train` wrote no model directory at {run / 'model'}")
    return run / "model"


def _optimized(onnx_dir: Path, provider: str, threads: int | None) -> str:
    """Load the export on ``provider`` (which optimizes it and caches the result); the cached model's path."""
    from inference.onnx_backend import CACHE_DIR, OnnxBackend

    backend = OnnxBackend(onnx_dir, providers=[provider], threads=threads)
    cached = backend.optimized_path or next((onnx_dir / CACHE_DIR).glob("model.all.*.onnx"), None)
    backend.close()
    return str(cached or onnx_dir / "model.onnx")


def make_engine(model: str | None, out: str | Path, precision: str = "fp32", train_minutes: float = 10.0,
                threads: int | None = None) -> dict[str, Any]:
    """Export + validate, then build TensorRT, else the ONNX Runtime model optimized for CUDA, else for
    the CPU. Returns a report: what was built, where, and why.
    """
    from inference.onnx_backend import cuda_provider_status

    from .onnx_export import export_onnx
    from .tensorrt import build_engine

    out = Path(out)
    model_dir = Path(model) if model else train_default_model(out, train_minutes)
    onnx_dir = out / ("onnx" if precision == "fp32" else f"onnx-{precision}")
    usable, reason = tensorrt_status()
    for_tensorrt = usable and precision in ("fp32", "fp16")
    cuda, cuda_reason = cuda_provider_status()  # present; whether a GPU answers shows when it loads
    # A CPU-only graph may run the char-CNN once per distinct token (Unique, a CPU kernel in ONNX Runtime).
    manifest = export_onnx(model_dir, onnx_dir, precision=precision, threads=threads,
                           token_dedup=not (for_tensorrt or cuda))
    par = manifest["parity"]
    validated = f"ONNX validated against torch (max |diff| {par['max_abs']:.1e}, min cosine {par['min_cosine']:.6f})"
    if for_tensorrt:
        m = build_engine(onnx_dir, out / "tensorrt", fp16=precision == "fp16")
        return {"engine": f"TensorRT {precision} engine", "path": str(out / "tensorrt" / m["engine"]["file"]),
                "why": f"{reason}; {validated}", "onnx": str(onnx_dir)}
    if usable:
        reason = f"{reason}, but a {precision} graph is ONNX Runtime-only (TensorRT takes fp32/fp16 exports)"
    provider, path = "CUDAExecutionProvider", None
    if cuda:
        try:
            path = _optimized(onnx_dir, provider, threads)
        except ExportError as e:  # onnxruntime-gpu without a usable GPU: say so, build for the CPU
            cuda_reason = str(e)
    if path is None:
        provider, path = "CPUExecutionProvider", _optimized(onnx_dir, "CPUExecutionProvider", threads)
        cuda_reason = f"no CUDA: {cuda_reason}"
    return {"engine": f"ONNX Runtime optimized {precision} model ({provider}, level all)", "path": path,
            "why": f"no TensorRT: {reason}; {cuda_reason}; {validated}", "onnx": str(onnx_dir)}
