"""ONNX exports built on demand: ``elmo embed --backend onnx --precision int8 --model MODEL_DIR``.

A model directory given to the ONNX backend is exported once per precision into a cache keyed by
what the export depends on: the model's options and weights (sha256), the precision, the opset,
the export format and the ONNX Runtime version (its quantizer writes the int8 graph). Changed
weights give a new key, so a stale export is never run. Each entry is a complete, validated
`elmo export onnx` directory (parity checked against the torch backend at the precision's
tolerance, ``formats.export_spec.TOLERANCES``); it is built in a temporary directory and renamed
into place, so a reader sees a whole entry or none, and two processes building the same entry at
once both end up with one of them.

Where: ``$ELMO_CACHE_DIR``, else ``$XDG_CACHE_HOME/elmo-pipeline``, else ``~/.cache/elmo-pipeline``;
entries under ``onnx/``. Removing the directory only costs a rebuild.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from elmo_core import InputError
from elmo_core.atomic import atomic_dir
from elmo_core.names import VALIDATED_EXPORT_PRECISIONS
from elmo_core.storage import cache_root, file_sha256
from formats.export_manifest import FORMAT_VERSION, MANIFEST_NAME
from formats.export_spec import DEFAULT_OPSET
from formats.model_dir import resolve_model

from .onnx_export import export_onnx


def export_key(model: str | Path, precision: str, weights: str | Path | None = None,
               opset: int = DEFAULT_OPSET) -> str:
    """What an on-demand export of ``model`` depends on, as a 20-hex-digit key."""
    import onnxruntime

    files = resolve_model(model, weights)
    parts = {"options": file_sha256(files.options), "weights": file_sha256(files.weights),
             "precision": precision, "opset": opset, "format_version": FORMAT_VERSION,
             "onnxruntime": onnxruntime.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def cached_onnx_export(model: str | Path, precision: str, weights: str | Path | None = None,
                       threads: int | None = None, root: Path | None = None,
                       on_build: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
    """The validated ONNX export of ``model`` at ``precision``: (its directory, whether it was built
    now). ``on_build(target)`` is called before a build starts (it takes a while: the parity check
    runs the torch backend and ONNX Runtime on the spec's shapes)."""
    if precision not in VALIDATED_EXPORT_PRECISIONS:
        raise InputError(f"--precision {precision}: an ONNX model is built on demand in one of "
                         f"{list(VALIDATED_EXPORT_PRECISIONS)} (bf16 cannot be validated on ONNX Runtime's CPU "
                         f"provider; use `elmo export onnx --precision bf16 --no-validate`)")
    target = (root or cache_root()) / "onnx" / f"{precision}-{export_key(model, precision, weights)}"
    if (target / MANIFEST_NAME).is_file():
        return target, False
    if on_build is not None:
        on_build(target)
    with atomic_dir(target, MANIFEST_NAME) as tmp:
        export_onnx(model, tmp, precision=precision, threads=threads, weights=weights)  # raises ParityError
    return target, True
