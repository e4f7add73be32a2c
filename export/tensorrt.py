"""`elmo export tensorrt`: a serialized TensorRT engine from an `elmo export onnx` directory.

Written against the TensorRT 10 Python API (Builder, OnnxParser, IBuilderConfig, optimization
profiles, timing cache, build_serialized_network). The network is strongly typed: precision comes
from the ONNX graph's own types, so FP16 means an fp16 export (`elmo export onnx --precision fp16`,
which keeps clips, cell state, reductions and the mix in fp32). TensorRT is the optional
`tensorrt` extra and is imported only when used.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from elmo_core.names import TENSORRT_PRECISIONS
from storage.locations import file_sha256
from formats.errors import ExportError
from formats.export_manifest import ENGINE_NAME, FORMAT_VERSION, check_file, producer, read_spec, write_manifest
from formats.export_spec import DEFAULT_PROFILE, ExportSpec
from inference.tensorrt_runtime import gpu_identity, import_tensorrt

TIMING_CACHE_NAME = "timing.cache"
DEFAULT_WORKSPACE_MB = 4096


def parse_bt(text: str, flag: str) -> tuple[int, int]:
    """'batch,length' -> (batch, length), for --min/--opt/--max."""
    try:
        b, t = (int(v) for v in text.split(","))
    except ValueError:
        raise ExportError(f"{flag}: expected BATCH,LENGTH (two integers), got {text!r}") from None
    return b, t


def profile_from_args(spec: ExportSpec, min_bt: str | None, opt_bt: str | None,
                      max_bt: str | None) -> dict[str, tuple[tuple[int, ...], ...]]:
    lo, mid, hi = (parse_bt(v, f) if v else d for v, f, d in
                   zip((min_bt, opt_bt, max_bt), ("--min", "--opt", "--max"), DEFAULT_PROFILE))
    return spec.profile(lo, mid, hi)


def _serialize(trt, onnx_path: Path, profile: dict, workspace_mb: int, cache_path: Path) -> tuple[bytes, bool]:  # type: ignore[no-untyped-def]
    """Parse, configure (workspace, profile, timing cache) and build; (engine bytes, strongly typed)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # always on (flag ignored) in TensorRT 11
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise ExportError(f"{onnx_path}: TensorRT's ONNX parser failed: " + " | ".join(errors[:5]))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    opt_profile = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.items():
        opt_profile.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt_profile)
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT could not build an engine from {onnx_path} (see the TensorRT log above)")
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return bytes(serialized), bool(flags)


def build_engine(onnx_dir: str | Path, out_dir: str | Path, min_bt: str | None = None, opt_bt: str | None = None,
                 max_bt: str | None = None, precision: str | None = None,
                 workspace_mb: int = DEFAULT_WORKSPACE_MB) -> dict[str, Any]:
    """Build, serialize and describe an engine in the export's own precision (``precision``, where
    given, must be it). Returns the manifest written beside it."""
    onnx_manifest, spec = read_spec(onnx_dir, "onnx")
    onnx_path = check_file(onnx_dir, onnx_manifest["onnx"])
    if spec.precision not in TENSORRT_PRECISIONS or precision not in (None, spec.precision):
        wanted = precision if precision in TENSORRT_PRECISIONS else "/".join(TENSORRT_PRECISIONS)
        raise ExportError(f"{onnx_dir} is a {spec.precision} export; TensorRT builds strongly typed networks in "
                          f"the export's own precision, so a {wanted} engine needs "
                          f"`elmo export onnx --precision {wanted}` (or no --precision here)")
    if not onnx_manifest["onnx"].get("tensorrt_parsable", True):
        raise ExportError(f"{onnx_dir} holds ops TensorRT's ONNX parser does not take "
                          f"({onnx_manifest['onnx'].get('tensorrt_note')}); export it for TensorRT with "
                          f"`elmo export onnx` in fp32/fp16 without --token-dedup")
    profile = profile_from_args(spec, min_bt, opt_bt, max_bt)
    trt = import_tensorrt()
    gpu = gpu_identity()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine, strongly_typed = _serialize(trt, onnx_path, profile, workspace_mb, out_dir / TIMING_CACHE_NAME)
    (out_dir / ENGINE_NAME).write_bytes(engine)
    copy_dictionaries(onnx_manifest["source"]["architecture"], Path(onnx_dir), out_dir)
    manifest = {
        "kind": "tensorrt", "format_version": FORMAT_VERSION, "producer": producer(),
        "tensorrt": {"version": trt.__version__, "strongly_typed": strongly_typed, "workspace_mb": workspace_mb},
        "gpu": gpu, "precision": spec.precision,
        "profile": {name: {"min": list(s[0]), "opt": list(s[1]), "max": list(s[2])} for name, s in profile.items()},
        "engine": {"file": ENGINE_NAME, "sha256": file_sha256(out_dir / ENGINE_NAME)},
        "onnx": {"dir": str(onnx_dir), "sha256": onnx_manifest["onnx"]["sha256"]},
        "source": onnx_manifest["source"], "spec": spec.to_dict(),
        "inputs": [t.to_dict() for t in spec.inputs], "outputs": [t.to_dict() for t in spec.outputs],
        "build_seconds": round(time.perf_counter() - t0, 1), "timing_cache": TIMING_CACHE_NAME,
    }
    write_manifest(out_dir, manifest)
    return manifest


def tensorrt_ep_providers(spec: ExportSpec, profile: dict[str, tuple[tuple[int, ...], ...]],
                          cache_dir: str | Path) -> list[Any]:
    """ONNX Runtime's TensorRT execution provider (the alternative path) in the export's precision,
    with CUDA as fallback."""
    def shapes(k: int) -> str:
        return ",".join(f"{name}:{'x'.join(str(d) for d in s[k])}" for name, s in profile.items())

    options = {"trt_fp16_enable": spec.precision == "fp16", "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache_dir),
               "trt_timing_cache_enable": True, "trt_profile_min_shapes": shapes(0),
               "trt_profile_opt_shapes": shapes(1), "trt_profile_max_shapes": shapes(2)}
    return [("TensorrtExecutionProvider", options), "CUDAExecutionProvider"]


def copy_dictionaries(architecture: dict, src: Path, dst: Path) -> None:
    """A dictionary model's char.dic / word.dic, which the engine's backend tokenizes with."""
    for name in (architecture.get("dictionaries") or {}).get("chars"), (architecture.get("dictionaries") or {}).get("words"):
        if name:
            shutil.copyfile(src / name, dst / name)
