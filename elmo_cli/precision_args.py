"""``--precision`` for the commands that run a model (``elmo embed``, ``elmo serve``): its choices,
and the precision made concrete once, before anything runs, with the reason printed.

torch: the matrix products' precision (``auto``: the fastest this device multiplies in hardware).
onnx: an export directory runs its own precision (asking for another is an error); a model
directory is exported at the asked precision once, validated and cached (``export.cache``), and
``--model`` then names that export.
"""
from __future__ import annotations

import argparse
import sys

from elmo_core.errors import InputError
from elmo_core.names import EXPORT_PRECISIONS, PRECISIONS
from inference.precision import bf16_cpu_warning, int8_cpu_report, resolve_precision
from inference.registry import exported_precision

CHOICES = tuple(dict.fromkeys(PRECISIONS + EXPORT_PRECISIONS)) + ("auto",)


def add_precision_argument(group: argparse._ActionsContainer) -> None:
    group.add_argument("--precision", choices=CHOICES, default=None,
                       help="torch: the matrix products (default fp32; tf32: CUDA only). auto: the fastest this "
                            "device multiplies in hardware within parity (bf16 on CUDA and on CPUs with AMX or "
                            "AVX512-BF16, else fp32). onnx: an export runs its own precision; a model directory "
                            "is exported at this one (fp32, fp16 or int8) once, validated and cached. "
                            "See docs/pipelines.md")


def settle_precision(args: argparse.Namespace) -> str:
    """Replace ``auto`` (and no ``--precision``) by the precision that runs; for the onnx backend on a
    model directory, point ``args.model`` at its cached export. Print what was picked and why; warn
    about bf16 on a CPU that emulates it, refuse bf16 / fp16 where torch multiplies them in scalar code. Returns the reason (recorded in the job's manifest)."""
    asked = args.precision or "fp32"
    precision, why = resolve_precision(asked, args.device, args.backend)
    if args.backend == "onnx":
        precision, why = _settle_onnx(args, args.precision, precision, why)
    if args.precision == "auto":
        print(f"precision auto: {precision} ({why})", file=sys.stderr)
    warning = bf16_cpu_warning(precision, args.device) if args.backend == "torch" else None  # may refuse
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    args.precision = precision
    return why


def _settle_onnx(args: argparse.Namespace, asked: str | None, precision: str, why: str) -> tuple[str, str]:
    """The onnx backend: (precision, reason); ``args.model`` becomes the export that runs."""
    exported = exported_precision(args.model, "onnx")
    if exported is not None:
        if asked not in (None, "auto", exported):
            raise InputError(f"--model {args.model} is an {exported} ONNX export; for --precision {asked} pass the "
                             f"model directory it came from (exported on demand), or run "
                             f"`elmo export onnx --precision {asked}`")
        return exported, "the export's precision"
    from export.cache import cached_onnx_export  # onnx and the exporter load only when a model is exported

    def building(target: object) -> None:
        print(f"onnx: exporting {args.model} at {precision} once (validated against torch) into {target}",
              file=sys.stderr)
    target, _ = cached_onnx_export(args.model, precision, args.weights, args.threads, on_build=building)
    print(f"onnx: running the {precision} export {target}", file=sys.stderr)
    args.model, args.weights = str(target), None
    why = f"{why}; exported on demand ({target.name})"
    return precision, f"{why}; {int8_cpu_report()}" if precision == "int8" else why
