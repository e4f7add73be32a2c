"""``elmo serve --engine ray``: the same app and batcher as a Ray Serve deployment, one per replica,
each ready once its model is loaded and warmed up. A replica takes at most ``max_queue`` requests at
once (each has a sentence, so its batcher's queue is never short), and callers queue at most
``max_queue`` more before Ray Serve answers 503 itself."""
from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Callable

from elmo_core.errors import InputError
from inference.model_run import ModelRun
from inference.precision import worker_cpu_flags
from runtime.ray_local import init_local_ray

from .app import create_app
from .limits import AccessOptions, ConnectionLimits, ServeLimits
from .middleware import exposure_warning
from .server import bind, url
from .service import ServingState

LOAD_TIMEOUT_S = 600.0


def _ray() -> Any:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise InputError("--engine ray needs Ray Serve: pip install 'elmo-pipeline[ray,serve]'") from None
    return ray, serve


class ElmoReplica:
    """One Ray Serve replica: a ServingState, loaded before the replica counts as started."""

    def __init__(self, run: ModelRun, limits: ServeLimits, access: AccessOptions) -> None:
        self.state, self.access = ServingState(run, limits), access
        self.state.start()
        if not self.state.wait_ready(LOAD_TIMEOUT_S):
            raise self.state.error or TimeoutError(f"{run.model} not loaded in {LOAD_TIMEOUT_S:.0f} s")

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.state, self.access)

    def check_health(self) -> None:
        if self.state.error is not None:
            raise self.state.error


def deployment(serve: Any, run: ModelRun, limits: ServeLimits, access: AccessOptions, replicas: int,
               num_gpus: float, shutdown_timeout_s: float = ConnectionLimits().shutdown_timeout_s) -> Any:
    """The bound Ray Serve application of ``replicas`` ElmoReplicas, each reserving ``run``'s threads in
    CPUs and finishing the requests it holds, for up to ``shutdown_timeout_s``, when it is deleted."""
    resources = {"num_cpus": run.threads.count, "num_gpus": num_gpus}
    return serve.deployment(serve.ingress()(ElmoReplica), name="elmo", num_replicas=replicas,
                            max_ongoing_requests=limits.max_queue, max_queued_requests=limits.max_queue,
                            graceful_shutdown_timeout_s=shutdown_timeout_s,
                            ray_actor_options=resources).bind(run, limits, access)


def _free_port(host: str) -> int:
    with bind(host, 0) as sock:
        return sock.getsockname()[1]


def run_ray_serve(run: ModelRun, limits: ServeLimits, host: str = "127.0.0.1", port: int = 0,
                  replicas: int = 1, num_gpus: float = 0.0, ray_address: str | None = None,
                  quiet: bool = False, access: AccessOptions = AccessOptions(), share: bool = False,
                  judge: Callable[[frozenset[str]], ModelRun] | None = None,
                  connections: ConnectionLimits = ConnectionLimits()) -> int:
    """Deploy on a Ray cluster (a local one of our own without ``ray_address``), print ``listening on
    URL`` once every replica is ready, serve until SIGTERM / SIGINT, then tear it all down. ``share``:
    each replica takes the cluster's CPUs / replicas, not ``run``'s threads; ``judge``: the run that
    deploys, from a replica's machine's CPU flags (``--precision auto`` is settled where it runs);
    ``connections``: its ``shutdown_timeout_s`` only (Ray Serve's proxy keeps the connections)."""
    ray, serve = _ray()
    if warning := exposure_warning(host, access):
        print(f"elmo serve: warning: {warning}", file=sys.stderr, flush=True)
    stop = threading.Event()
    if ray_address is None:  # a local cluster of our own: it ends with this process, however it ends
        init_local_ray(ray, include_dashboard=False, log_to_driver=not quiet)
    else:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=not quiet)
    # After ray.init, which installs handlers of its own that abort the driver on SIGTERM.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if judge is not None:  # one task with a replica's GPUs asks the CPU of a machine the replicas run on
            task = ray.remote(num_cpus=1, num_gpus=num_gpus or None)(worker_cpu_flags)
            run = judge(ray.get(task.remote(), timeout=LOAD_TIMEOUT_S))
        port = port or _free_port(host)
        if share:  # no --threads: each replica takes its share of the cluster's CPUs
            share_cpus = max(1, int(ray.cluster_resources().get("CPU", 1.0) // replicas))
            run = run.on_replica(share_cpus, f"each replica's share of the cluster's CPUs ({replicas} replicas)")
        print(f"elmo serve: deploying the model {run.describe()} on Ray Serve, {replicas} replica(s)",
              file=sys.stderr, flush=True)
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(serve, run, limits, access, replicas, num_gpus, connections.shutdown_timeout_s),
                  name="elmo", route_prefix="/")
        print(f"listening on {url(host, port)}", flush=True)
        while not stop.wait(0.5):
            pass
        serve.delete("elmo")  # SIGTERM: the replicas finish what they hold (up to --shutdown-timeout-s), then go
    finally:
        serve.shutdown()
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0

