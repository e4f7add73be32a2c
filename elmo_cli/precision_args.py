"""``--precision`` for the commands that run the torch backend (``elmo embed``, ``elmo serve``):
its choices, and ``auto`` made concrete once, before anything runs, with the reason printed."""
from __future__ import annotations

import argparse
import sys

from elmo_core.names import PRECISIONS
from elmo_core.precision import bf16_cpu_warning, resolve_precision

CHOICES = PRECISIONS + ("auto",)


def add_precision_argument(group: argparse._ActionsContainer, default: str) -> None:
    group.add_argument("--precision", choices=CHOICES, default=default,
                       help="the torch backend's matrix products (tf32: CUDA only). auto: the fastest this "
                            "device multiplies in hardware within parity (bf16 on CUDA and on CPUs with AMX "
                            "or AVX512-BF16, else fp32); see docs/pipelines.md")


def settle_precision(args: argparse.Namespace) -> str:
    """Replace ``auto`` by the precision it picks; print what it picked and why, and warn about bf16
    on a CPU that emulates it. Returns the reason (recorded in the job's manifest)."""
    precision, why = resolve_precision(args.precision, args.device, args.backend)
    if args.precision == "auto":
        print(f"precision auto: {precision} ({why})", file=sys.stderr)
    warning = bf16_cpu_warning(precision, args.device)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    args.precision = precision
    return why
