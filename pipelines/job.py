"""``embed_parquet``: one ``elmo embed`` job, from checks to ``_SUCCESS``; the local runner.

Order of work: everything that needs no write is checked first (every input footer, column and
column type, one schema across the files, an existing OUTPUT_DIR as far as it is judged without the
model, ``claim_first``; then the model loaded and matched to its weights, its files
hashed as they load: the job's model, which every replica checks before it loads it, the device;
whether another job holds OUTPUT_DIR, then whether it is this job's; Spark's session or Ray's
cluster reached); then OUTPUT_DIR is locked (one job at a time) and claimed (its job record,
``_job.parquet``); finished shards are verified byte for byte and kept, the rest are (re)done; the
manifest and ``_SUCCESS`` come last, and the lock file is deleted. A kill at any point leaves only complete, committed shards and
temporaries that the next ``--resume`` deletes; any failure removes its temporaries.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from corpora.files import would_read
from elmo_core.errors import InputError
from storage.atomic import digest
from storage.locations import file_sha256, is_below
from inference.errors import ModelChangedError
from inference.run_settings import RunSettings

from .claim import check_claim, claim_output_dir, clean_strays, mark_stopped
from .claim_first import RunMaker, check_output_first, job_identity
from .options import EmbedOptions
from .errors import OutputDirError
from .os_errors import os_errors
from .output_dir import open_output
from .shard_size import kept_rows_per_shard, settle_rows_per_shard
from .stages import StageClock
from .progress import ProgressBar, note
from .schema import output_schema
from .shard_files import FORMATS
from .sink import COMMITS_DIR, COUNTS, SUCCESS_FILE, Output, commit_name, discard_shard, job_file, manifest_file, \
    remove_temporaries, verify_shard
from .source import InputFile, Shard, passthrough_schema, scan_inputs, shards_of

if TYPE_CHECKING:  # loaded once the inputs are checked: an input or output error answers without the model code
    from inference.model_run import ModelRun

    from .predictor import ElmoPredictor

    Model = ModelRun | str | Path | RunMaker  # a run, a model path, or what makes the run


@dataclass
class Job:
    input: str
    out: Output  # a local OUTPUT_DIR or one on an object store (pipelines.output_dir)
    run: ModelRun  # the model (a path, or a URI each worker fetches: storage.locations) and how it runs
    opts: EmbedOptions
    files: list[InputFile]
    schema: pa.Schema  # every shard's
    identity: dict
    digest: str
    predictor: ElmoPredictor | None = None  # the local runner's, loaded before anything is written
    clock: StageClock = field(default_factory=StageClock)  # seconds per stage, all runners
    kept: list[dict] = field(default_factory=list)  # records of shards verified and kept

    @property
    def total_rows(self) -> int:
        return sum(f.rows for f in self.files)

    def replica_run(self, shards: list[Shard], replicas: int) -> "ModelRun":
        """The record each of a cluster's ``replicas`` runs over ``shards`` (the pending ones): the
        job's run with its share of the expected tokens, which its own warm-up must repay."""
        return self.run.shared(sum(s.rows for s in shards), self.total_rows, replicas)


def plan_job(input: str | Path, output: str | Path, maker: RunMaker, opts: EmbedOptions) -> Job:
    """Every check that writes nothing: OUTPUT_DIR, the inputs and their one schema, the claim on an
    existing OUTPUT_DIR as far as it is decided without the model (``claim_first``), before any model
    code loads; then the model run (made by ``maker`` once, on a cluster with its workers' CPU
    flags where ``--precision auto`` needs them), the model (loaded) and the claim on an existing
    OUTPUT_DIR."""
    out = open_output(output)
    out.prepare()
    _check_scale_out(opts, maker.settings)
    if opts.engine == "spark":
        from .spark_runner import check_spark
        check_spark()
    note(f"reading the inputs {input}", opts.quiet)
    files = scan_inputs(input, opts)
    _check_apart(input, out, files)
    passthrough = passthrough_schema(files, opts)
    kept = kept_rows_per_shard(opts, out)
    check_output_first(out, maker, opts, files, kept, passthrough)
    run = maker(_worker_flags(opts, maker.settings), _tokens_left(out, opts, files, kept))
    from .predictor import ElmoPredictor

    run, opts = opts.settle(run)  # the budget asked where asked, the writer threads, which the shard size follows
    opts = opts.sized_for(run, settle_rows_per_shard(opts, files, kept))  # Spark's session starts where its slots decide
    if opts.engine != "local":
        note(f"shards of {opts.rows_per_shard:,} rows ({opts.rows_per_shard_reason})", opts.quiet)
        note(f"checking the model {run.describe()}; each replica loads its own", opts.quiet)
    log = (lambda text: note(text, opts.quiet)) if opts.engine == "local" else None
    here = run if opts.engine == "local" else run.on_cpu()  # the replicas' GPUs may be out of this process's sight
    predictor = ElmoPredictor(here, opts, log=log, pin=True)  # the model's own errors (files, options vs weights)
    run = run.pinned(predictor.run.pin)  # what every replica must load (and the local runner loaded)
    config = predictor.config
    if opts.engine != "local":
        predictor.close()  # Ray's and Spark's workers load their own
        predictor = None
    schema = output_schema(passthrough, config.output_dim, config.n_output_layers, opts.vectors, opts.vector_layout)
    identity = job_identity(files, run.pin, opts.identity(run.backend, run.precision))
    try:
        if out.exists():  # refused before the lock is taken: a refused job leaves nothing behind
            out.lock().check_free()  # a running job's first: what it holds is its own business
            check_claim(out, identity, digest(identity), opts.resume)
        _start_engine(opts)  # its settings and its cluster, before OUTPUT_DIR is claimed
    except BaseException:
        if predictor is not None:
            predictor.close()
        raise
    return Job(str(input), out, run, opts, files, schema, identity, digest(identity), predictor)


def _tokens_left(out: Output, opts: EmbedOptions, files: list[InputFile], kept: tuple[int, str] | None) -> int:
    """The job's expected tokens (its files'), which a compiled layout's warm-up must repay; a local
    job resumed: less those of the shards its OUTPUT_DIR holds, cut at the size it keeps (``kept``;
    none recorded: no shard kept). Those are verified only once the model loaded and one that fails
    is embedded again, so this errs toward fewer tokens: the eager layout. A cluster's replicas each
    weigh their share of the shards left to them (``Job.replica_run``)."""
    tokens = sum(f.expected_tokens for f in files)
    if kept is None or not (opts.resume and opts.engine == "local" and out.exists()):
        return tokens
    rows, total = kept[0], sum(f.rows for f in files)
    if total == 0:
        return tokens
    present = out.entries()
    done = sum(s.rows for s in shards_of(files, rows, opts.shard_format.suffix) if s.name in present)
    return tokens * (total - done) // total


def _check_scale_out(opts: EmbedOptions, settings: RunSettings) -> None:
    if opts.engine == "ray" and settings.device != "cpu" and not opts.num_gpus_per_worker:
        raise InputError(f"--device {settings.device} with --engine ray needs --num-gpus-per-replica (e.g. 1) so "
                         f"that Ray gives each replica its own GPU")


def _worker_flags(opts: EmbedOptions, settings: RunSettings) -> frozenset[str] | None:
    """The CPU flags of the machines a cluster job's model runs on, where ``--precision auto`` is
    settled by them (a CPU run on Ray or Spark; its engine started here to ask one of its workers);
    None: this machine's."""
    if opts.engine == "local" or not settings.auto_on_cpu:
        return None
    _start_engine(opts)
    if opts.engine == "spark":
        from .spark_runner import worker_cpu_flags
    else:
        from .ray_runner import worker_cpu_flags
    return worker_cpu_flags(opts)


def _check_apart(input: str | Path, out: Output, files: list[InputFile]) -> None:
    """OUTPUT_DIR and INPUT do not overlap: no input file inside OUTPUT_DIR, and no shard of OUTPUT_DIR
    where INPUT would read it (a later run would take it for input)."""
    inside = [str(f.path) for f in files if is_below(f.path, str(out))]
    if inside:
        raise OutputDirError(f"{inside[0]}: an input file inside OUTPUT_DIR {out}; the job would write beside "
                             f"(or over) what it reads: choose an OUTPUT_DIR outside INPUT")
    if any(would_read(input, out.where(f"part-00000-00000{f.suffix}")) for f in FORMATS.values()):
        raise OutputDirError(f"OUTPUT_DIR {out} is inside INPUT {input}: the next run (--resume) would read its "
                             f"shards as input; choose an OUTPUT_DIR outside INPUT (or one whose name starts with "
                             f"'_' or '.', which INPUT skips)")


def _check_input_contents(job: Job) -> None:
    """--verify-inputs: every input file's sha256, recorded in the job record by the first run, compared by later
    ones."""
    fmt = job.opts.shard_format
    record = job.out.read_record(job_file(fmt))
    hashes = {str(f.path): file_sha256(f.path) for f in job.files}
    if "input_sha256" not in record:
        if job.out.commit_names(COMMITS_DIR):
            raise OutputDirError(f"{job.out}: --verify-inputs needs the input hashes of the run that wrote these "
                                 f"shards, and that run did not hash its inputs; rerun without --verify-inputs "
                                 f"or start a new OUTPUT_DIR with it")
        job.out.write_record(job_file(fmt), {**record, "input_sha256": hashes}, job.schema)
        return
    changed = sorted(p for p, h in hashes.items() if record["input_sha256"].get(p) != h)
    if changed:
        raise OutputDirError(f"{job.out}: input files changed since the shards were written: {changed[:3]} "
                             f"(content sha256); restore them, or start a new OUTPUT_DIR")


def pending_shards(job: Job) -> list[Shard]:
    """Verify the finished shards (kept in ``job.kept``), delete the rest; return what is left to do."""
    shards = shards_of(job.files, job.opts.rows_per_shard, job.opts.shard_format.suffix)
    clean_strays(job.out, {s.name for s in shards}.__contains__, job.opts.shard_format)
    pending, present, commits = [], job.out.entries(), set(job.out.commit_names(COMMITS_DIR))
    for s in shards:
        record = verify_shard(job.out, s, job.digest, job.schema, job.run.pin["sha256"]) if s.name in present else None
        if record is None:
            if s.name in present or commit_name(s.name) in commits:  # a store charges each request
                discard_shard(job.out, s.name)
            pending.append(s)
        else:
            job.kept.append(record)
    return pending


def run_local(job: Job, shards: list[Shard], progress: ProgressBar) -> tuple[list[dict], dict]:
    """The local runner: the job's one model, in this process."""
    from .shard_loop import embed_shards

    records = embed_shards(job.predictor, shards, job.out, job.schema, job.digest, progress.update, job.clock,
                           span=True)
    return records, {"name": "local", **job.predictor.backend.device_report()}


def _final_check(job: Job, records: list[dict]) -> None:
    """Before _SUCCESS: every shard of the job is committed, present at its committed size, and
    together they hold every input row once (each was checksummed when committed or kept)."""
    for f in job.files:
        f.check_unchanged()
    by_name = {r["file"]: r for r in records}
    for s in shards_of(job.files, job.opts.rows_per_shard, job.opts.shard_format.suffix):
        r = by_name.get(s.name)
        if r is None or r["rows"] != s.rows or job.out.size(s.name) != r["bytes"] \
                or job.out.size(commit_name(s.name)) is None:
            raise OutputDirError(f"{job.out.where(s.name)}: not committed as this job's rows "
                                 f"{s.start}..{s.start + s.rows} of {s.file.path}; rerun with --resume")
    if sum(r["rows"] for r in records) != job.total_rows:
        raise OutputDirError(f"{job.out}: the shards hold {sum(r['rows'] for r in records)} rows, the inputs "
                             f"{job.total_rows}; rerun with --resume")


def manifest(job: Job, records: list[dict], seconds: float, runner_info: dict) -> dict:
    records = sorted(records, key=lambda r: (r["input_file"], r["row_start"]))
    total = {k: sum(r.get(k, 0) for r in records) for k in COUNTS}
    new = [r for r in records if r.get("new")]
    new_tokens = sum(r["tokens"] for r in new)
    return {
        "format": "elmo-pipeline/embed/2", "input": job.input, "inputs": job.identity["inputs"],
        "model": job.identity["model"], "run": job.run.to_dict(), "options": job.opts.to_dict(),
        "job_digest": job.digest,
        "schema": job.schema.to_string(show_schema_metadata=False), **total,
        "shards": [{k: r[k] for k in ("file", "input_file", "row_start", "rows", "tokens", "sha256", "bytes")}
                   for r in records],
        "this_run": {"shards": len(new), "shards_kept": len(records) - len(new), "rows": sum(r["rows"] for r in new),
                     "tokens": new_tokens, "seconds": round(seconds, 3),
                     "tokens_per_second": round(new_tokens / seconds, 1) if seconds > 0 else None},
        "engine": runner_info,  # the runner, named as its --engine flag
    }


def _run(job: Job, lock: Any) -> dict:
    """The job's part that writes, under OUTPUT_DIR's ``lock``."""
    opts = job.opts
    try:
        job.digest = claim_output_dir(job.out, job.identity, job.digest, opts.resume, opts.shard_format, job.schema)
        if opts.verify_inputs:
            _check_input_contents(job)
        shards = pending_shards(job)
    except OutputDirError:
        lock.finished()  # refused before anything is written: OUTPUT_DIR as it was, without a lock file
        raise
    progress = ProgressBar(job.total_rows, sum(r["rows"] for r in job.kept), quiet=opts.quiet,
                        done_tokens=sum(r.get("tokens", 0) for r in job.kept))
    note(f"embedding {job.total_rows - progress.rows:,} rows into {job.out} (the first batches warm up)", opts.quiet)
    t0 = time.perf_counter()
    try:
        new, info = _runner(opts.engine)(job, shards, progress)
        for r in new:
            r["new"] = True
        _final_check(job, job.kept + new)
    except BaseException as e:
        remove_temporaries(job.out)  # a runner's writers may have died with it (Ray workers)
        told = _told(job, e)
        if told is None:
            raise
        raise told from None
    finally:
        progress.close()
    seconds = time.perf_counter() - t0
    result = manifest(job, job.kept + new, seconds, info)
    result["stages"] = job.clock.report(seconds, job.run.device)
    if result["stages"]["bound_by"] == "write" and (opts.format, opts.vector_layout) == ("parquet", "floats"):
        result["stages"]["advice"] = ("the writer bounds this job: --vector-layout binary or --format arrow write "
                                      "6-10x faster than Parquet float lists (docs/pipelines.md)")
    lock.check()
    job.out.write_record(manifest_file(opts.shard_format), result, job.schema)
    job.out.write_bytes(SUCCESS_FILE, b"")  # empty: readers that open every file skip it
    lock.finished()  # a finished output keeps no lock file
    return result


def _told(job: Job, e: BaseException) -> BaseException | None:
    """A runner's failure with what to do next, where the job knows (None: raised as it is)."""
    fmt = job.opts.shard_format
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, SIGTERM: say what is kept and how to go on
        e.add_note(_kept(job))
    if isinstance(e, ModelChangedError):  # a replica's: it computed nothing
        return ModelChangedError(f"{e}\n  the shards committed were computed with the job's model (its sha256 is "
                                 f"in {job_file(fmt)}) and are kept: restore its files, then rerun with --resume; or "
                                 f"embed with this model into a new OUTPUT_DIR")
    if isinstance(e, InputError):  # a bad row, a changed input: fixed, the same command starts over
        mark_stopped(job.out, e, fmt, job.schema)
        return InputError(f"{e}\n  fix the input, then rerun the same command: this OUTPUT_DIR's shards are "
                          f"then redone from the fixed input")
    return None


def _kept(job: Job) -> str:
    """What an interrupted job leaves: its committed shards, and the command that continues it."""
    records = []
    for name in job.out.commit_names(COMMITS_DIR):
        try:
            records.append(job.out.read_record(name))
        except (OSError, InputError, OutputDirError):
            continue  # an unreadable commit is redone by --resume, as it is not counted here
    rows = sum(r.get("rows", 0) for r in records if isinstance(r, dict))
    return (f"kept: {len(records)} finished shards with {rows:,} of {job.total_rows:,} rows in {job.out}; "
            f"rerun the same command with --resume to continue from there")


def embed_parquet(input: str | Path, output_dir: str | Path, /, model: Model, **options: Any) -> dict:
    """Embed a Parquet corpus into OUTPUT_DIR (see docs/pipelines.md); return the manifest.

    ``model``: a model path, the ``ModelRun`` the caller resolved (its layout settled without this
    job's size: ``resolve_run(..., expected_tokens=)`` weighs it), or a ``RunMaker`` (the CLI's);
    ``options``: the fields of :class:`pipelines.options.EmbedOptions` and, with a model path, of
    :class:`inference.run_settings.RunSettings` (the CLI flags, snake_case; ``output`` is the output
    mode, hence INPUT and OUTPUT_DIR are positional-only).
    Shape: each input row -> one output row with ``elmo`` (T, D) or, for output 'all', (T, L+1, D).
    """
    for name, value in (("input", input), ("output_dir", output_dir)):
        if not isinstance(value, (str, os.PathLike)):
            raise InputError(f"{name} must be a path or a URI, got {type(value).__name__} {value!r}")
    settings, rest = RunSettings.split(options)
    opts = EmbedOptions.coerce(rest)
    return run_job(input, output_dir, RunMaker.of(model, settings, remote=opts.engine != "local"), opts)


def run_job(input: str | Path, output_dir: str | Path, maker: RunMaker, opts: EmbedOptions) -> dict:
    """``embed_parquet`` with its records made: the door's (the CLI's) entry."""
    job = plan_job(input, output_dir, maker, opts)
    try:
        with os_errors(job.out):
            job.out.create()
            with job.out.lock() as lock:
                result = _run(job, lock)
    finally:
        if job.predictor is not None:
            job.predictor.close()
    if not opts.quiet:
        print(summary_line(result, job.out), file=sys.stderr)
    return result


def _start_engine(opts: EmbedOptions) -> None:
    """Spark's session or Ray's cluster, started or reached (InputError where its settings are wrong
    or it cannot be reached, in a bounded time)."""
    if opts.engine == "spark":
        from .spark_runner import spark_session
        spark_session(opts.spark_master, opts.spark_conf, opts.verbose)
    elif opts.engine == "ray":
        from .ray_runner import init_ray
        init_ray(opts)


def _runner(name: str) -> Callable[[Job, list[Shard], ProgressBar], tuple[list[dict], dict]]:
    if name == "ray":
        from .ray_runner import run_ray
        return run_ray
    if name == "spark":
        from .spark_runner import run_spark
        return run_spark
    return run_local


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def summary_line(m: dict, out: Output) -> str:
    run = m["this_run"]
    kept = f", {_n(run['shards_kept'], 'shard')} kept from a previous run" if run["shards_kept"] else ""
    bad = f", {m['invalid_utf8']:,} with invalid UTF-8 dropped" if m.get("invalid_utf8") else ""
    windowed = (f"{_n(m['windowed_rows'], 'row')} in {_n(m['windows'], 'window')}, " if m["windowed_rows"]
                else "none windowed, ")
    return (f"elmo embed: {_n(m['rows'], 'row')}, {_n(m['tokens'], 'token')} ({windowed}{m['null_rows']:,} null{bad}) "
            f"-> {out} ({_n(len(m['shards']), 'shard')}{kept}); "
            f"this run {_n(run['tokens'], 'token')} in {run['seconds']:.1f} s = {run['tokens_per_second'] or 0:,.0f} tokens/s"
            + (f"; stages: {_stage_line(m['stages'])}" if m.get("stages") else ""))


def _stage_line(stages: dict) -> str:
    busy = f", device busy {stages['device_busy']:.0%}" if "device_busy" in stages else ""
    advice = f"; {stages['advice']}" if stages.get("advice") else ""
    return ", ".join(f"{k} {v:.1f} s" for k, v in stages["seconds"].items()) + \
        f" (overlapping); {stages['process_cpu_seconds']:.1f} CPU s{busy}; bound by {stages['bound_by']}{advice}"
