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


def make_engine(model: str | None, out: str | Path, precision: str = "fp32", train_minutes: float = 10.0,
                threads: int | None = None) -> dict[str, Any]:
    """Export + validate, then build TensorRT or the optimized ONNX Runtime model. Returns a report."""
    from inference.onnx_backend import OnnxBackend

    from .onnx_export import export_onnx
    from .tensorrt import build_engine

    out = Path(out)
    model_dir = Path(model) if model else train_default_model(out, train_minutes)
    onnx_dir = out / ("onnx" if precision == "fp32" else f"onnx-{precision}")
    usable, reason = tensorrt_status()
    for_tensorrt = usable and precision in ("fp32", "fp16")
    # An ONNX Runtime-only graph may run the char-CNN once per distinct token (Unique).
    manifest = export_onnx(model_dir, onnx_dir, precision=precision, threads=threads, token_dedup=not for_tensorrt)
    par = manifest["parity"]
    validated = f"ONNX validated against torch (max |diff| {par['max_abs']:.1e}, min cosine {par['min_cosine']:.6f})"
    if for_tensorrt:
        m = build_engine(onnx_dir, out / "tensorrt", fp16=precision == "fp16")
        return {"engine": f"TensorRT {precision} engine", "path": str(out / "tensorrt" / m["engine"]["file"]),
                "why": f"{reason}; {validated}", "onnx": str(onnx_dir)}
    if usable:
        reason = f"{reason}, but a {precision} graph is ONNX Runtime-only (TensorRT takes fp32/fp16 exports)"
    backend = OnnxBackend(onnx_dir, threads=threads)
    cached = backend.optimized_path or next((onnx_dir / ".ort_cache").glob("model.all.*.onnx"), None)
    backend.close()
    return {"engine": f"ONNX Runtime optimized {precision} model (CPUExecutionProvider, level all)",
            "path": str(cached or onnx_dir / "model.onnx"), "why": f"no TensorRT: {reason}; {validated}",
            "onnx": str(onnx_dir)}
