"""``elmo serve --model MODEL``: ELMo vectors over HTTP with dynamic batching (see docs/serving.md), on this
machine (uvicorn) or on a Ray cluster (Ray Serve, ``--engine ray``)."""
from __future__ import annotations

import argparse
import os
import signal

from elmo_cli.run_args import add_precision_argument, model_run
from elmo_cli.status import say, say_loading
from elmo_cli.vocabulary import Subcommands, add_fields, add_flag, add_model, field_values, need_model
from elmo_core.errors import InputError
from inference.registry import BACKEND_NAMES
from serving.limits import AccessOptions, ConnectionLimits, ServeLimits, check_address, check_replicas

def register(sub: Subcommands) -> None:
    p = sub.add_parser("serve", help="serve ELMo vectors over HTTP (/embed, /v1/embeddings, /metrics)",
                       description="Serve a model over HTTP with dynamic batching; prints `listening on URL` "
                                   "once the model is loaded and warmed up (see docs/serving.md).")
    add_model(p, "model directory (options.json + weights), or an export dir for onnx / tensorrt")
    add_flag(p, "backend", choices=BACKEND_NAMES)
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int, help="the model's threads (default: the backend's)")
    add_precision_argument(p)
    add_flag(p, "token_embeddings")
    add_flag(p, "token_vocab")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="default 8080; 0: any free port (the `listening on` line says which)")
    add_fields(p, ServeLimits, "limits")
    add_fields(p, ConnectionLimits, "connections")
    access = p.add_argument_group("access")
    access.add_argument("--api-key", default=os.environ.get("ELMO_API_KEY"),
                        help="requests must send Authorization: Bearer KEY, else 401 (default: $ELMO_API_KEY; none "
                             "where it is unset; an empty key is refused)")
    access.add_argument("--protect-probes", action="store_true",
                        help="/health, /ready and /metrics need the key too (default: open to orchestrators)")
    access.add_argument("--cors-allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin allowed to call the API (CORS), e.g. https://app.example.com "
                             "or * (repeatable)")
    add_flag(p, "quiet", help="no access log line per request")
    ray = p.add_argument_group("ray serve")
    ray.add_argument("--engine", choices=("local", "ray"), default="local",
                     help="local: this machine (uvicorn); ray: a Ray Serve deployment (default local)")
    add_flag(ray, "replicas", type=int, default=1, help="Ray Serve replicas of the model, each loading it (default 1)")
    add_flag(ray, "num_gpus_per_replica", type=float, default=0.0)
    add_flag(ray, "ray_address")
    p.set_defaults(func=run_serve)


def _ignore(signum: int, frame: object) -> None:
    """uvicorn re-raises the signal that stopped it once it is done; a served-out stop exits 0."""


def run_serve(args: argparse.Namespace) -> int:
    need_model(args, "serve")
    check_address(args.host, args.port)
    check_replicas(args.replicas, args.num_gpus_per_replica)
    limits = ServeLimits(**field_values(ServeLimits, args))
    connections = ConnectionLimits(**field_values(ConnectionLimits, args))
    access = AccessOptions(args.api_key, args.protect_probes, tuple(args.cors_allow_origin))
    run = model_run(args, remote=args.engine == "ray")  # a bad model fails here, before binding the port
    try:
        from serving.server import run_server
        from serving.service import ServingState
    except ImportError as e:
        raise InputError(f"elmo serve needs the `serve` extra: pip install 'elmo-pipeline[serve]' ({e})") from e
    if args.engine == "ray":
        from inference.run_settings import RunSettings
        from serving.ray_serve import run_ray_serve

        auto = RunSettings(args.backend, args.device, precision=args.precision).auto_on_cpu  # judged by a replica's CPU
        return run_ray_serve(run, limits, args.host, args.port, args.replicas, args.num_gpus_per_replica,
                             args.ray_address, args.quiet, access, share=args.threads is None,
                             judge=(lambda flags: model_run(args, remote=True, flags=flags)) if auto else None,
                             connections=connections)
    say_loading("serve", run)
    say("serve", "warming up; `listening on URL` follows once the model answers")
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_server(ServingState(run, limits), args.host, args.port, args.quiet, connections=connections,
                   access=access)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
