"""The Spark runner (``--engine spark``): the job's pending shards as the tasks of one Spark job.

As with Ray (``pipelines.ray_runner``), the unit of work is a shard (``--rows-per-shard`` rows of
one input file): a DataFrame of the pending shards' indices, one partition each, goes through
``mapInArrow``, whose task runs ``shard_loop.embed_shards`` on its shard (the same reader,
predictor, writer, schema and commit as the local runner) and returns the shard's commit record.
So the output is the local runner's, shard for shard, ids in input order; Spark schedules the
tasks on its executors, retries a failed one (``spark.task.maxFailures``) and may run a slow one
twice (``spark.speculation``). That a task may run more than once is what the commit protocol
settles: a shard is published by its first writer only and a later one adopts it
(``pipelines.sink``), so a retried, speculative or killed task never leaves a row twice or not
at all, and ``--resume`` after a killed driver keeps every committed shard.

Each executor's Python worker loads the model once (``spark_worker.predictor_for``: the worker's one
model, the previous run's closed; PySpark reuses its workers), after it hashed the model's files and found the job's model (the run is
pinned to it, ``ModelRun.pinned``), and runs it on ``--threads`` threads (default 1:
``spark.task.cpus`` tasks share an executor's cores). Tasks read INPUT and write OUTPUT_DIR
themselves: local paths every executor sees, or ``s3://`` (``storage.locations``). An error that
a retry would meet again (a bad row, another model than the job's, a full or read-only disk) is
returned to the driver as data (``spark_worker.TaskError``: its kind, message, shard and row), not
retried, and raised there as the local runner raises it.

The session is started before OUTPUT_DIR is claimed (``job.plan_job``): a master that cannot be
reached, or settings Spark refuses, leave OUTPUT_DIR as it was. Its task slots (``defaultParallelism``)
size the shards where ``--rows-per-shard`` is not given (``pipelines.shard_size``). Spark's own log
lines go to stderr at WARN (INFO with ``--verbose``) through a log4j2 configuration given to the
driver's JVM as it starts, so that its start prints nothing; a local master binds to 127.0.0.1
unless ``SPARK_LOCAL_IP`` says otherwise. While the tasks run, a line of progress follows each
shard committed (``_shards/``, polled by the driver).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

from elmo_core.errors import ElmoError, InputError
from storage.atomic import write_text_atomic

from .options import EmbedOptions

from .errors import WorkerLostError
from .progress import ProgressBar
from .sink import COMMITS_DIR, read_commit, remove_temporaries
from .source import Shard
from .spark_worker import RESULT, TaskError, embed_task

# What a job sets unless --spark-conf says otherwise: no web UI or console progress (the job prints
# its own), and a failed task retried as a cluster does by default (local mode would not retry).
SPARK_DEFAULTS = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                  "spark.task.maxFailures": "4"}
REACH_SECONDS = 10.0  # how long the driver tries to reach a standalone master before it gives up
POLL_SECONDS = 0.5  # how often the driver looks for newly committed shards
LOG4J2 = """status = error
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""

_STARTS: dict[str, float] = {}  # per driver: seconds each session (by its master) took to start


def check_spark() -> None:
    """InputError where pyspark or Java is missing (``plan_job`` asks before anything is written)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise InputError("--engine spark needs pyspark: pip install -e '.[spark]'") from None
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise InputError("--engine spark needs Java 17 or later, and none was found: install it and set "
                         "JAVA_HOME (or put java on PATH)")


def spark_session(master: str | None, conf: tuple[str, ...] = (), verbose: bool = False):  # type: ignore[no-untyped-def]
    """A SparkSession for ``master`` (default ``local[*]``, or spark-submit's ``--master``) with the
    ``K=V`` settings of ``conf`` (an existing session of this process is taken as it is); InputError
    where the master does not answer or Spark refuses to start with these settings."""
    check_spark()
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    level = "INFO" if verbose else "WARN"
    given = (kv.partition("=") for kv in conf)  # KEY=VALUE each, as EmbedOptions checked it
    settings = {**SPARK_DEFAULTS, "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_config(level)}",
                **{key.strip(): value for key, _, value in given}}
    builder = SparkSession.builder.appName("elmo embed")
    if master or not os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit, its --master holds
        master = local_master(master or "local[*]", settings["spark.task.maxFailures"])
        builder = builder.master(master)
        if master.startswith("local"):  # executors are this machine's: they run this interpreter
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        _reach(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        t0 = time.perf_counter()
        spark = builder.getOrCreate()
        _STARTS.setdefault(spark.sparkContext.master, time.perf_counter() - t0)
    except (Py4JError, PySparkException, RuntimeError) as e:
        raise InputError(f"Spark could not start a session on {master or 'the master spark-submit gave'} with the "
                         f"settings given (--spark-master, --spark-conf): {_first_line(e)}") from None
    spark.sparkContext.setLogLevel(level)
    return spark


def spark_slots(opts: EmbedOptions) -> tuple[int, str]:
    """(the tasks the session runs at once, in words): its ``defaultParallelism``."""
    spark = spark_session(opts.spark_master, opts.spark_conf, opts.verbose)
    n = spark.sparkContext.defaultParallelism
    return n, f"{n} Spark task slot{'s' if n != 1 else ''} ({spark.sparkContext.master})"


def worker_cpu_flags(opts: EmbedOptions) -> frozenset[str]:
    """The CPU flags of an executor (one task asks its CPU): ``--precision auto`` is settled by them
    (``pipelines.job``)."""
    return session_cpu_flags(spark_session(opts.spark_master, opts.spark_conf, opts.verbose))


def session_cpu_flags(spark: Any) -> frozenset[str]:
    """The CPU flags of one of ``spark``'s executors (one task asks its CPU)."""
    from inference.precision import worker_cpu_flags as flags

    return spark.sparkContext.parallelize([0], 1).map(flags).collect()[0]


def _log_config(level: str) -> str:
    """A log4j2 configuration file: Spark's lines at ``level`` on stderr, Hadoop's native-library note off."""
    path = os.path.join(tempfile.gettempdir(), f"elmo-spark-log4j2-{level.lower()}-{os.getuid()}.properties")
    text = LOG4J2.format(level=level.lower())
    if not os.path.exists(path) or open(path).read() != text:
        write_text_atomic(path, text)
    return path


def _reach(master: str) -> None:
    """InputError where no standalone master of ``spark://HOST:PORT[,HOST:PORT...]`` accepts a
    connection within ``REACH_SECONDS`` (Spark itself retries for minutes)."""
    if not master.startswith("spark://"):
        return
    why = ""
    deadline = time.monotonic() + REACH_SECONDS
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)),
                                     timeout=max(0.5, deadline - time.monotonic())).close()
            return
        except (OSError, ValueError) as e:
            why = f"{address}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
    raise InputError(f"--spark-master {master}: no Spark master answered within {REACH_SECONDS:.0f} s ({why}); check "
                     f"the address and that the master runs (start-master.sh), then rerun")


def _first_line(e: BaseException) -> str:
    """An exception's message without its Java or Python trace: the Java exception's own line
    where py4j wraps one."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    java = [line for line in lines if re.match(r"[\w.$]+(Exception|Error)\b", line)]
    return (java or lines or [type(e).__name__])[0][:300]


def task_attempts(spark: Any) -> int:
    """How often Spark runs a failing task before it fails the job: F of ``local[N,F]`` (1 in
    another local master, which ignores spark.task.maxFailures), else spark.task.maxFailures."""
    local = re.fullmatch(r"local(?:\[(?:\*|\d+)(?:,(\d+))?\])?", spark.sparkContext.master)
    if local:
        return int(local.group(1) or 1)
    return int(spark.sparkContext.getConf().get("spark.task.maxFailures", "4"))


def local_master(master: str, max_failures: str) -> str:
    """``local[N]`` retries a failed task as a cluster does (``local[N,F]``, F = spark.task.maxFailures)."""
    m = re.fullmatch(r"local\[(\*|\d+)\]", master)
    return f"local[{m.group(1)},{max_failures}]" if m else master


def run_spark(job, shards: list[Shard], progress: ProgressBar) -> tuple[list[dict], dict]:  # type: ignore[no-untyped-def]
    opts: EmbedOptions = job.opts
    spark = spark_session(opts.spark_master, opts.spark_conf, opts.verbose)
    info = {"name": "spark", "master": spark.sparkContext.master, "spark_version": spark.version,
            "session_s": round(_STARTS.get(spark.sparkContext.master, 0.0), 3)}  # started as the job was planned
    if not shards:
        return [], info
    from pyspark.sql.pandas.types import from_arrow_schema

    replicas = min(spark.sparkContext.defaultParallelism, len(shards))  # a Python worker each, loading its model
    task = embed_task(job.replica_run(shards, replicas), opts.to_dict(), shards, job.out, job.schema, job.digest)
    with _shard_progress(job.out, shards, progress) as shown:
        frame = spark.range(len(shards), numPartitions=len(shards)).mapInArrow(task, from_arrow_schema(RESULT))
        rows = _collect(spark, frame)
    remove_temporaries(job.out)  # a killed attempt's: the committed shards are every shard now
    errors = [TaskError(**r.error.asDict()) for r in rows if r.error is not None]
    if errors:
        raise errors[0].error()
    records, loads = [], {}  # loads: models each process loaded
    for r in rows:
        records.append(json.loads(r.record))
        job.clock.add(json.loads(r.seconds))
        loads[r.process] = max(loads.get(r.process, 0), r.loads)
        if records[-1]["file"] not in shown:
            progress.update(records[-1]["rows"], records[-1]["tokens"], at_once=True)
    return records, {**info, "processes": len(loads), "model_loads": loads}


def _collect(spark: Any, frame: Any) -> list:
    """The tasks' result rows; WorkerLostError where Spark gave up on a task (its attempts spent, an
    executor lost): what was committed is kept for ``--resume``."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        return frame.collect()
    except (Py4JError, PySparkException) as e:
        n = task_attempts(spark)
        raise WorkerLostError(f"a Spark task failed {n} time{'s' if n != 1 else ''} (its attempts: "
                              f"spark.task.maxFailures, or F of local[N,F]) or its executor was lost "
                              f"({_first_line(e)}); the shards committed in this run are kept: rerun with "
                              f"--resume") from None


@contextlib.contextmanager
def _shard_progress(out: Any, shards: list[Shard], progress: ProgressBar) -> Iterator[set[str]]:
    """While the tasks run: a progress line per shard committed (its commit record, polled);
    yields the names of those shown."""
    pending, shown, stop = {s.name for s in shards}, set(), threading.Event()

    def poll() -> None:
        while not stop.wait(POLL_SECONDS):
            try:
                names = out.commit_names(COMMITS_DIR)
            except (OSError, ElmoError):
                continue  # a store that did not answer this time: the next poll asks again
            for name in names:
                shard = name.rsplit("/", 1)[-1]  # a commit record has its shard's name
                if shard in pending and shard not in shown:
                    record = read_commit(out, shard)
                    if record is not None:
                        shown.add(shard)
                        progress.update(int(record.get("rows", 0)), int(record.get("tokens", 0)), at_once=True)

    thread = threading.Thread(target=poll, name="elmo-spark-progress", daemon=True)
    thread.start()
    try:
        yield shown
    finally:
        stop.set()
        thread.join()
