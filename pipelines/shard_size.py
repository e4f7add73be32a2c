"""How many rows a shard holds where ``--rows-per-shard`` is not given, settled once per job and
recorded with it (the job record's options, the manifest's ``rows_per_shard_reason``).

A shard is the unit a runner hands out: Spark's task, a Ray replica's call, a local writer
thread's file. On several slots (Spark's ``defaultParallelism``: N of ``local[N]``, a cluster's
executor cores; Ray's replicas) the corpus is cut into ``TASKS_PER_SLOT`` shards per slot, so that
every slot gets work and a slow shard does not hold the job alone, each at least ``MIN_ROWS`` rows
(below that a task's start costs more than its rows) and at most ``DEFAULT_ROWS``. The local
runner's slots are its writer threads (``--writer-threads``: one on a CPU, up to 16 on a GPU,
``options.default_writers``): with one it keeps ``DEFAULT_ROWS``; with W it cuts the corpus the
same way, and a shard holds at most 1/W of a sort window's rows but at least ``WINDOW_MIN_ROWS``
for that cut (files of ~250k tokens of sentences, not thousands of small ones), so that each
window (``pipelines.source.read_windows``, which goes on past a shard's end: the batches stay the
window's) gives several writers a shard to encode at once, with a few windows in memory (on an
80 GB GPU a window is 65,536 rows or 1M tokens, 4 GiB of float32 vectors: 12 writers' shards of
5,461 rows, cut at 10,000, not 12 windows). A resumed job keeps the size its OUTPUT_DIR records,
whatever the engine now.
"""
from __future__ import annotations

from elmo_core.errors import InputError

from .options import EmbedOptions

from .errors import OutputDirError
from .sink import Output, side_names
from .source import InputFile

DEFAULT_ROWS = 100_000
MIN_ROWS = 500
WINDOW_MIN_ROWS = 10_000
TASKS_PER_SLOT = 2


def kept_rows_per_shard(opts: EmbedOptions, out: Output) -> tuple[int, str] | None:
    """(the rows per shard no engine chooses, why): ``--rows-per-shard``, or the size OUTPUT_DIR's job
    recorded (a resumed job keeps it); None: the engine's slots choose (``settle_rows_per_shard``).
    Read once a job, before its run: the claim, the tokens left and the shard size read it."""
    if opts.rows_per_shard is not None:
        return opts.rows_per_shard, "--rows-per-shard"
    recorded = _recorded(out)
    return None if recorded is None else (recorded, "as this OUTPUT_DIR's job recorded")


def settle_rows_per_shard(opts: EmbedOptions, files: list[InputFile],
                          kept: tuple[int, str] | None) -> tuple[int, str]:
    """(the job's rows per shard, why): ``kept`` (``kept_rows_per_shard``), else by the engine's slots."""
    if kept is not None:
        return kept
    slots, which = engine_slots(opts)
    if slots <= 1:
        return DEFAULT_ROWS, f"{which}: the default"
    total = sum(f.rows for f in files)
    rows = min(DEFAULT_ROWS, max(MIN_ROWS, -(-total // (TASKS_PER_SLOT * slots))))
    why = f"{total:,} rows over {which}: {TASKS_PER_SLOT} shards a slot, {MIN_ROWS:,} to {DEFAULT_ROWS:,} rows each"
    window = opts.sort_window_rows or DEFAULT_ROWS
    if opts.engine == "local" and max(WINDOW_MIN_ROWS, window // slots) < rows:
        rows = max(WINDOW_MIN_ROWS, window // slots)
        why = f"{which}: 1/{slots} of a sort window's {window:,} rows each, at least {WINDOW_MIN_ROWS:,}"
    return rows, why


def engine_slots(opts: EmbedOptions) -> tuple[int, str]:
    """(shards the engine runs at once, in words); ``opts`` sized for the run (``writer_threads``)."""
    if opts.engine == "spark":
        from .spark_runner import spark_slots
        return spark_slots(opts)
    if opts.engine == "ray":
        return opts.workers, f"{opts.workers} Ray replica{'s' if opts.workers != 1 else ''}"
    writers = opts.writer_threads or 1
    if writers == 1:
        return 1, "the local runner writes one shard at a time"
    return writers, f"{writers} writer threads"


def _recorded(out: Output) -> int | None:
    try:
        names = side_names(out) if out.exists() else None
        rows = out.read_record(names[0]).get("options", {}).get("rows_per_shard") if names else None
    except (InputError, OutputDirError, AttributeError):
        return None  # not a job record of this version: check_claim says so
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None
