"""``--backend onnx --precision auto`` on a model directory: each candidate precision
(``inference.precision.ONNX_AUTO_CANDIDATES``) exported on demand and validated (``export.cache``),
the ones that validate timed in turns on the calibration sample, and the fastest chosen by
``inference.precision.fastest_validated``. The choice, every candidate's min token cosine and speed
are recorded in the cache beside the exports (``onnx/auto-<key>.json``, keyed by the model, the
sample, ONNX Runtime and the CPU), so a later job on this CPU reuses them.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from storage.atomic import write_json_atomic
from storage.locations import cache_root
from formats import load_bilm, resolve_model
from formats.export_manifest import MANIFEST_NAME, ONNX_NAME, read_spec
from inference.precision import ONNX_AUTO_CANDIDATES, MeasuredPrecision, cpu_model, fastest_validated

from .cache import Sample, cached_onnx_export, export_key
from .errors import ParityError
from .onnx_export import ort_run
from .text_parity import default_sample, sample_batches, tokens_per_s

TURNS = 3  # timing turns per candidate; the best of each counts


def auto_onnx_export(model: str | Path, weights: str | Path | None = None, threads: int | None = None,
                     root: Path | None = None, on_build: Callable[[Path], None] | None = None,
                     sample: Sample | None = None) -> tuple[Path, str, str]:
    """(the export that runs, its precision, why), measured once per model, sample and CPU."""
    root = root or cache_root()
    key = hashlib.sha256(f"{export_key(model, 'auto', weights, sample=sample)} {cpu_model()}".encode()).hexdigest()
    record_path = root / "onnx" / f"auto-{key[:20]}.json"
    record = _record(record_path)
    if record is not None:
        return Path(record["export"]), record["precision"], record["why"]
    exports, measured = {}, []
    for precision in ONNX_AUTO_CANDIDATES:
        try:
            exports[precision], _ = cached_onnx_export(model, precision, weights, threads, root, on_build, sample,
                                                       suggest=False)
        except ParityError as e:
            measured.append(MeasuredPrecision(precision, None, failure=str(e)))
    speeds = _time_in_turns(model, weights, exports, threads, sample)
    for precision, path in exports.items():
        text = json.loads((path / MANIFEST_NAME).read_text())["parity"]["text"]
        measured.append(MeasuredPrecision(precision, text["min_cosine"], speeds[precision]))
    precision, why = fastest_validated(measured)
    write_json_atomic(record_path, {"precision": precision, "why": why, "export": str(exports[precision]),
                                    "cpu": cpu_model(), "candidates": [m.to_dict() for m in measured]})
    return exports[precision], precision, why


def _record(path: Path) -> dict | None:
    """The recorded choice, where it and the export it names are still there; else None (measured
    again: removing any cache entry only costs a rebuild)."""
    try:
        record = json.loads(path.read_text())
        export = Path(record["export"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if (export / MANIFEST_NAME).is_file() and (export / ONNX_NAME).is_file() else None


def _time_in_turns(model: str | Path, weights: str | Path | None, exports: dict[str, Path], threads: int | None,
                   sample: Sample | None) -> dict[str, float]:
    """Tokens/s of each export on the sample, in turns, the best turn of each."""
    files = resolve_model(model, weights)
    sentences, source = sample or default_sample()
    _, batches = sample_batches(sentences, load_bilm(files.options, files.weights).tokenizer, source)
    runs = {p: ort_run(path / ONNX_NAME, read_spec(path, "onnx")[1], threads) for p, path in exports.items()}
    best = dict.fromkeys(runs, 0.0)
    for _ in range(TURNS):
        for precision, run in runs.items():
            best[precision] = max(best[precision], tokens_per_s(run, batches))
    return best
