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


def cuda_provider_status() -> tuple[bool, str]:
    """(present, reason): this ONNX Runtime has the CUDA provider (whether a GPU answers shows at load)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return True, f"onnxruntime {ort.__version__} has CUDAExecutionProvider"
    return False, f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (the `gpu` extra: onnxruntime-gpu)"


def _ort_engine(onnx_dir: Path, cuda: bool, threads: int | None) -> tuple[str, str, str]:
    """Load (and so optimize and cache) the export on CUDA if asked and possible, else on the CPU.

    Returns (the provider it runs on, path of the cached optimized model, why not CUDA or '').
    """
    from inference.onnx_backend import OnnxBackend

    attempts = [["CUDAExecutionProvider"]] if cuda else []
    why = ""
    for providers in attempts + [["CPUExecutionProvider"]]:
        try:
            backend = OnnxBackend(onnx_dir, providers=providers, threads=threads)
        except ExportError as e:
            if providers == ["CPUExecutionProvider"]:
                raise
            why = str(e)
            continue
        cached = backend.optimized_path or next((onnx_dir / ".ort_cache").glob("model.all.*.onnx"), None)
        backend.close()
        return providers[0], str(cached or onnx_dir / "model.onnx"), why
    raise AssertionError("unreachable: the CPU attempt returns or raises")


def make_engine(model: str | None, out: str | Path, precision: str = "fp32", train_minutes: float = 10.0,
                threads: int | None = None) -> dict[str, Any]:
    """Export + validate, then build TensorRT, else the ONNX Runtime model optimized for CUDA, else for
    the CPU. Returns a report: what was built, where, and why.
    """
    from .onnx_export import export_onnx
    from .tensorrt import build_engine

    out = Path(out)
    model_dir = Path(model) if model else train_default_model(out, train_minutes)
    onnx_dir = out / ("onnx" if precision == "fp32" else f"onnx-{precision}")
    usable, reason = tensorrt_status()
    for_tensorrt = usable and precision in ("fp32", "fp16")
    cuda, cuda_reason = cuda_provider_status()
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
    provider, path, cuda_failed = _ort_engine(onnx_dir, cuda, threads)
    on_cuda = provider == "CUDAExecutionProvider"
    why = f"no TensorRT: {reason}; {cuda_reason if on_cuda else 'no CUDA: ' + (cuda_failed or cuda_reason)}"
    return {"engine": f"ONNX Runtime optimized {precision} model ({provider}, level all)", "path": path,
            "why": f"{why}; {validated}", "onnx": str(onnx_dir)}
