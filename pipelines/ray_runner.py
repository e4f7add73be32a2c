"""The Ray runner (``--engine ray``): the job's pending shards spread over ``--replicas`` Ray actors.

Each actor holds one ``ElmoPredictor`` (loaded once for the whole job) and runs
``shard_loop.embed_shards`` on the shards it is given: the same reader, predictor, writer,
schema and commit records as the local runner, so a shard's rows are in input order by
construction and ``--resume`` works shard by shard for both runners.

The unit of work is one shard (``--rows-per-shard`` rows of one input file), so a job runs as
many shards at once as it has workers and pending shards. Workers read INPUT, fetch the model and
write OUTPUT_DIR themselves: on a cluster with no shared disk all three live in an object store
(``s3://``; ``storage.locations``, ``pipelines.output_dir``), and each worker reaches it with the
credentials of its own environment; the endpoint and region variables of the driver's are passed
on (``FORWARDED_ENV``), never its secrets. The driver holds OUTPUT_DIR's lock, hands out shards
and collects their commit records. Each actor hashes the model's files once, before it loads them,
and refuses another model than the job's (``ModelRun.pinned``). The cluster is reached (or the
local one started) before OUTPUT_DIR is claimed (``job.plan_job``).
"""
from __future__ import annotations

import math
import os
import socket

import pyarrow as pa

from elmo_core.errors import ElmoError, InputError, SettingError
from storage.locations import LOCATION_VARIABLES
from inference.model_run import ModelRun
from runtime.ray_local import init_local_ray

from .os_errors import lasting_os_error
from .options import EmbedOptions
from .errors import WorkerLostError
from .predictor import ElmoPredictor
from .progress import ProgressBar, note
from .shard_loop import embed_shards
from .sink import Output
from .source import Shard
from .stages import StageClock

# Where the store is, not who may use it: workers take credentials from their own environment
# (an instance role, the cluster's secrets), so none travel through Ray's control plane.
FORWARDED_ENV = LOCATION_VARIABLES
REACH_SECONDS = 10.0  # how long the driver tries to reach --ray-address before it gives up


class ShardWorker:
    """One Ray actor's model; ``embed`` commits one shard and returns its commit record. A model the
    actor refuses (not the job's) is its answer to every shard: the actor lives to say so."""

    def __init__(self, run: ModelRun, options: dict) -> None:
        self.predictor: ElmoPredictor | None = None
        self.refused: ElmoError | None = None
        try:
            self.predictor = ElmoPredictor(run, options)
        except ElmoError as e:
            self.refused = e

    def embed(self, shard: Shard, out: Output, schema: pa.Schema, job_digest: str) -> tuple[dict, dict]:
        """(the shard's commit record, seconds per stage)."""
        if self.refused is not None:
            raise self.refused
        clock = StageClock()
        try:
            return embed_shards(self.predictor, [shard], out, schema, job_digest, clock=clock)[0], clock.seconds
        except OSError as e:  # a full or read-only disk, said as the local runner says it
            lasting = lasting_os_error(e, out)
            if lasting is None:
                raise
            raise lasting from None


WORKER_FLAGS_S = 300  # a replica's resources may wait for a node to join


def init_ray(opts: EmbedOptions):  # type: ignore[no-untyped-def]
    """Ray, connected to ``--ray-address`` (InputError where it does not answer in
    ``REACH_SECONDS``) or to a local cluster of its own."""
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs Ray: pip install -e '.[ray]'") from None
    if not ray.is_initialized():
        env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
        kwargs = {"include_dashboard": False, "log_to_driver": not opts.quiet,
                  "runtime_env": {"env_vars": env} if env else None}
        if opts.ray_address is None:  # a local cluster of our own: it ends with this process, however it ends
            init_local_ray(ray, **kwargs)
            return ray
        _reach(opts.ray_address)
        try:
            ray.init(address=opts.ray_address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise InputError(f"--ray-address {opts.ray_address}: Ray could not connect ({str(e).strip()[:300]}); "
                             f"check the address and that the cluster runs (ray start --head)") from None
    return ray


def _reach(address: str) -> None:
    """InputError where nothing accepts a connection at ``HOST:PORT`` (or ``ray://HOST:PORT``) within
    ``REACH_SECONDS`` (Ray itself waits for minutes); other forms (``auto``) are Ray's to find."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_SECONDS).close()
    except OSError as e:
        raise InputError(f"--ray-address {address}: nothing answered there within {REACH_SECONDS:.0f} s "
                         f"({e.strerror or e}); check the address and that the cluster runs (ray start --head)"
                         ) from None


def worker_cpu_flags(opts: EmbedOptions) -> frozenset[str]:
    """The CPU flags of a machine the replicas run on: one task with a replica's GPUs asks its CPU
    (``--precision auto`` is settled by them, ``pipelines.job``); Ray started by the job."""
    import ray

    from inference.precision import worker_cpu_flags as flags

    task = ray.remote(num_cpus=1, num_gpus=opts.num_gpus_per_worker or None)(flags)
    return ray.get(task.remote(), timeout=WORKER_FLAGS_S)


def _worker_cpus(nodes: list[dict], threads: int, workers: int) -> float:
    """CPUs each actor reserves: its model's threads, within what the cluster's ``nodes`` have for all
    workers (in Ray's units of 1e-4, rounded down, so that N shares fit the CPUs they were cut from)."""
    total = sum(float(node.get("CPU", 0.0)) for node in nodes) or 1.0
    return max(MIN_ACTOR_CPUS, math.floor(min(float(threads), total / workers) * 1e4) / 1e4)


MIN_ACTOR_CPUS = 0.25


def schedulable_replicas(asked: int, shards: int, cpus_each: float, nodes: list[dict], gpus_each: float = 0.0) -> int:
    """The replicas a job starts: those asked, no more than its shards, and no more than the cluster's
    ``nodes`` (each one's resources: an actor fits on one node) hold at ``cpus_each`` (``gpus_each``)
    a replica: an actor Ray cannot place would hold the shard the pool gave it for ever. 0: none fits."""
    def fits(node: dict) -> int:
        n = math.floor(float(node.get("CPU", 0.0)) / cpus_each + 1e-9)
        return min(n, math.floor(float(node.get("GPU", 0.0)) / gpus_each + 1e-9)) if gpus_each > 0 else n

    return max(0, min(asked, shards, sum(fits(node) for node in nodes)))


def _replicas(nodes: list[dict], opts: EmbedOptions, shards: int, cpus: float) -> int:
    """``schedulable_replicas`` on the cluster's ``nodes``, said where fewer than asked; InputError
    where not one fits."""
    replicas = schedulable_replicas(opts.workers, shards, cpus, nodes, opts.num_gpus_per_worker)
    held = (f"the cluster's {sum(float(n.get('CPU', 0.0)) for n in nodes):g} CPUs and "
            f"{sum(float(n.get('GPU', 0.0)) for n in nodes):g} GPUs on {len(nodes)} node(s) hold at {cpus:g} CPUs and "
            f"{opts.num_gpus_per_worker:g} GPUs a replica")
    if replicas == 0:
        raise SettingError(f"not one replica is what {held} (`num_gpus_per_worker`): give the cluster what a "
                           f"replica asks, or ask less")
    if replicas < min(opts.workers, shards):
        note(f"{replicas} Ray replicas of the {opts.workers} asked: what {held}", opts.quiet)
    return replicas


def run_ray(job, shards: list[Shard], progress: ProgressBar) -> tuple[list[dict], dict]:  # type: ignore[no-untyped-def]
    opts: EmbedOptions = job.opts
    ray = init_ray(opts)
    from ray.util import ActorPool

    info = {"name": "ray", "workers": opts.workers, "ray_version": ray.__version__,
            "num_gpus_per_worker": opts.num_gpus_per_worker}
    if not shards:
        return [], info
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]  # the cluster, asked once
    cpus = _worker_cpus(nodes, job.run.threads.count, opts.workers)
    actor = ray.remote(num_cpus=cpus, num_gpus=opts.num_gpus_per_worker or None)(ShardWorker)
    replicas = info["workers"] = _replicas(nodes, opts, len(shards), cpus)
    actors = [actor.remote(job.replica_run(shards, replicas), opts.to_dict()) for _ in range(replicas)]
    records = []
    try:
        pool = ActorPool(actors)
        for record, seconds in pool.map_unordered(lambda a, s: a.embed.remote(s, job.out, job.schema, job.digest),
                                                  shards):
            records.append(record)
            job.clock.add(seconds)
            progress.update(record["rows"], record["tokens"])
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ElmoError):  # a worker's own error (a bad row, another model, a full disk)
            raise e.cause from None
        raise
    except ray.exceptions.RayActorError as e:
        raise WorkerLostError(f"a Ray worker died while it wrote a shard ({str(e).splitlines()[0][:200]}); the "
                              f"{len(records)} shards committed in this run are kept: rerun with --resume") from None
    finally:
        for a in actors:
            ray.kill(a)
    return records, info
