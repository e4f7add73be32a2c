"""``elmo serve MODEL``: ELMo vectors over HTTP with dynamic batching (see docs/serving.md), on this
machine (uvicorn) or on a Ray cluster (Ray Serve, ``--engine ray``)."""
from __future__ import annotations

import argparse
import os
import signal
from dataclasses import fields

from elmo_cli.cmd_tokens import add_token_embedding_arguments
from elmo_core.errors import InputError
from elmo_cli.precision_args import add_precision_argument, settle_precision
from elmo_cli.status import say, say_loading
from inference.registry import BACKEND_NAMES, check_device, exported_backend, check_precision_for, model_config
from serving.limits import AccessOptions, ConnectionLimits, ServeLimits, check_port

def _add_fields(group: argparse._ArgumentGroup, cls: type) -> None:
    """One flag per field of the frozen dataclass ``cls`` (help: the field's metadata)."""
    for f in fields(cls):
        flag, text = f"--{f.name.replace('_', '-')}", f.metadata["help"]
        if isinstance(f.default, bool):
            group.add_argument(flag, action="store_true", help=text)
        elif f.default is None:  # a default that depends on the device, named in the help text
            group.add_argument(flag, type=int, default=None, help=text)
        else:
            group.add_argument(flag, type=type(f.default), default=f.default, help=f"{text} (default {f.default})")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve ELMo vectors over HTTP (/embed, /v1/embeddings, /metrics)",
                       description="Serve a model over HTTP with dynamic batching; prints `listening on URL` "
                                   "once the model is loaded and warmed up (see docs/serving.md).")
    p.add_argument("model", help="model directory (options.json + weights), or an export dir for onnx / tensorrt")
    p.add_argument("--weights", help="the weights file, when MODEL's directory holds several")
    p.add_argument("--backend", choices=BACKEND_NAMES, help="default: the export's own for an export directory "
                                                              "(its manifest.json), else torch")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="the model's threads (default: the backend's)")
    add_precision_argument(p)
    add_token_embedding_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (the `listening on` line says which)")
    _add_fields(p.add_argument_group("limits"), ServeLimits)
    _add_fields(p.add_argument_group("connections"), ConnectionLimits)
    access = p.add_argument_group("access")
    access.add_argument("--api-key", default=os.environ.get("ELMO_API_KEY") or None,
                        help="requests must send Authorization: Bearer KEY, else 401 (default: $ELMO_API_KEY; none)")
    access.add_argument("--protect-probes", action="store_true",
                        help="/health, /ready and /metrics need the key too (default: open to orchestrators)")
    access.add_argument("--cors-allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin allowed to call the API (CORS), e.g. https://app.example.com "
                             "or * (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no access log line per request")
    ray = p.add_argument_group("ray serve")
    ray.add_argument("--engine", choices=("local", "ray"), default="local")
    ray.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas of the model")
    ray.add_argument("--num-gpus-per-replica", type=float, default=0.0)
    ray.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")
    p.set_defaults(func=run_serve)


def _from_args(cls: type, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def _ignore(signum: int, frame: object) -> None:
    """uvicorn re-raises the signal that stopped it once it is done; a served-out stop exits 0."""


def run_serve(args: argparse.Namespace) -> int:
    check_port(args.port)
    limits, connections = _from_args(ServeLimits, args), _from_args(ConnectionLimits, args)
    access = AccessOptions(args.api_key, args.protect_probes, tuple(args.cors_allow_origin))
    args.backend = args.backend or exported_backend(args.model) or "torch"
    check_device(args.device, args.backend)
    settle_precision(args)
    check_precision_for(args.backend, args.precision, args.device)
    model_config(args.model, args.backend, args.weights)  # a bad model fails here, before binding the port
    try:
        from serving.server import run_server
        from serving.service import ModelSource, ServingState
    except ImportError as e:
        raise InputError(f"elmo serve needs the `serve` extra: pip install 'elmo-pipeline[serve]' ({e})") from e
    source = ModelSource(args.model, args.backend, args.device, args.weights, args.threads, args.token_embeddings,
                         args.token_vocab, args.precision)
    if args.engine == "local":
        say_loading("serve", args.model, args.threads, f"{args.backend} on {args.device}")
        say("serve", "warming up; `listening on URL` follows once the model answers")
    if args.engine == "ray":
        from serving.ray_serve import run_ray_serve

        return run_ray_serve(source, limits, args.host, args.port, args.replicas, args.num_gpus_per_replica,
                             args.ray_address, args.quiet, access)
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_server(ServingState(source, limits), args.host, args.port, args.quiet, connections=connections,
                   access=access)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
