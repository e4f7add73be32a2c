"""``embed_parquet``: one ``elmo embed`` job, from checks to ``_SUCCESS``; the local runner.

Order of work: every input footer and column is checked, the model is hashed, OUTPUT_DIR is
claimed (``_job.json``), finished shards are verified and kept, the rest are (re)done, then
``_manifest.json`` and ``_SUCCESS`` are written. A kill at any point leaves only complete shards
(renamed when done) and temporaries that the next ``--resume`` deletes.
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from elmo_core.errors import InputError
from inference.registry import check_device, model_identity

from .options import EmbedOptions, digest
from .predictor import ElmoPredictor
from .prefetch import prefetch
from .progress import Progress
from .sink import MANIFEST_FILE, SUCCESS_FILE, ShardWriter, claim_output_dir, clean_strays, verify_shard, \
    write_json_atomic
from .source import InputFile, Shard, read_windows, scan_inputs, shards_of


@dataclass
class Job:
    input: str
    out: Path
    model: Path
    opts: EmbedOptions
    files: list[InputFile]
    identity: dict
    digest: str
    kept: list[dict] = field(default_factory=list)  # records of shards verified and kept

    @property
    def total_rows(self) -> int:
        return sum(f.rows for f in self.files)


def plan_job(input: str | Path, output: str | Path, model: str | Path, opts: EmbedOptions) -> Job:
    files = scan_inputs(input, opts)
    identity = {"inputs": [{"path": str(f.path), "rows": f.rows, "bytes": f.size} for f in files],
                "model": model_identity(model, opts.backend), "options": opts.identity()}
    job = Job(str(input), Path(output), Path(model), opts, files, identity, digest(identity))
    claim_output_dir(job.out, identity, job.digest, opts.resume)
    return job


def pending_shards(job: Job) -> list[Shard]:
    """Verify the finished shards (kept in ``job.kept``), delete the rest; return what is left to do."""
    shards = shards_of(job.files, job.opts.rows_per_shard)
    clean_strays(job.out, {s.name for s in shards}.__contains__)
    pending = []
    for s in shards:
        path = job.out / s.name
        record = verify_shard(path, s, job.digest) if path.exists() else None
        if record is None:
            path.unlink(missing_ok=True)
            pending.append(s)
        else:
            job.kept.append(record)
    return pending


def _windows(shards: list[Shard], predictor: ElmoPredictor, opts: EmbedOptions) -> Iterator[tuple]:
    for file, group in itertools.groupby(shards, key=lambda s: s.file):
        offset = None
        try:
            for shard, table, last in read_windows(file, list(group), opts):
                offset = shard.start
                yield shard, predictor.prepare(table), last
        except InputError as e:
            where = f" (shard {offset} + rows)" if offset is not None else ""
            raise InputError(f"{file.path}{where}: {e}") from None


def run_local(job: Job, shards: list[Shard], progress: Progress) -> list[dict]:
    """The local runner: one model, prepare in a prefetch thread, compute and write here."""
    predictor = ElmoPredictor(job.model, job.opts)
    records: list[dict] = []
    writer: ShardWriter | None = None
    try:
        for shard, prepared, last in prefetch(_windows(shards, predictor, job.opts), job.opts.prefetch):
            table = predictor.compute(prepared)
            if writer is None:
                writer = ShardWriter(job.out, shard, table.schema, job.digest)
            plan = prepared.plan
            writer.write(table, plan.tokens, plan.windows, plan.windowed_rows)
            progress.update(table.num_rows, plan.tokens)
            if last:
                records.append(writer.commit())
                writer = None
    finally:
        if writer is not None:
            writer.abort()
        predictor.close()
    return records


def manifest(job: Job, records: list[dict], seconds: float, runner_info: dict) -> dict:
    records = sorted(records, key=lambda r: (r["input_file"], r["row_start"]))
    total = {k: sum(r[k] for r in records) for k in ("rows", "tokens", "windows", "windowed_rows", "null_rows")}
    new = [r for r in records if r.get("new")]
    new_tokens = sum(r["tokens"] for r in new)
    return {
        "format": "elmo-pipeline/embed/1", "input": job.input, "inputs": job.identity["inputs"],
        "model": job.identity["model"], "options": job.opts.to_dict(), "job_digest": job.digest,
        **total, "shards": [{k: r[k] for k in ("file", "input_file", "row_start", "rows", "tokens")} for r in records],
        "this_run": {"shards": len(new), "shards_kept": len(records) - len(new), "rows": sum(r["rows"] for r in new),
                     "tokens": new_tokens, "seconds": round(seconds, 3),
                     "tokens_per_second": round(new_tokens / seconds, 1) if seconds > 0 else None},
        "engine": runner_info,  # the runner, named as its --engine flag
    }


def embed_parquet(input: str | Path, output_dir: str | Path, /, model: str | Path, **options: Any) -> dict:
    """Embed a Parquet corpus into OUTPUT_DIR (see docs/pipelines.md); return the manifest.

    ``options``: the fields of :class:`pipelines.options.EmbedOptions` (the CLI flags, snake_case;
    ``output`` is the output mode, hence INPUT and OUTPUT_DIR are positional-only).
    Shape: each input row -> one output row with ``elmo`` (T, D) or, for output 'all', (T, L+1, D).
    """
    opts = EmbedOptions.coerce(options)
    if opts.engine == "local":  # Ray's workers may have GPUs that this process does not see
        check_device(opts.device, opts.backend)
    job = plan_job(input, output_dir, model, opts)
    shards = pending_shards(job) if opts.engine == "local" else []
    runner = _runner(opts.engine)
    done_rows = sum(r["rows"] for r in job.kept)
    progress = Progress(job.total_rows, done_rows, quiet=opts.quiet)
    t0 = time.perf_counter()
    try:
        new, info = runner(job, shards, progress)
    finally:
        progress.close()
    seconds = time.perf_counter() - t0
    for r in new:
        r["new"] = True
    result = manifest(job, job.kept + new, seconds, info)
    write_json_atomic(job.out / MANIFEST_FILE, result)
    (job.out / SUCCESS_FILE).write_text("")
    if not opts.quiet:
        print(summary_line(result, job.out), file=sys.stderr)
    return result


def _runner(name: str) -> Callable[[Job, list[Shard], Progress], tuple[list[dict], dict]]:
    if name == "ray":
        from .ray_runner import run_ray
        return run_ray

    def local(job: Job, shards: list[Shard], progress: Progress) -> tuple[list[dict], dict]:
        return run_local(job, shards, progress), {"name": "local", "threads": job.opts.threads, "device": job.opts.device}
    return local


def summary_line(m: dict, out: Path) -> str:
    run = m["this_run"]
    kept = f", {run['shards_kept']} shards kept from a previous run" if run["shards_kept"] else ""
    return (f"elmo embed: {m['rows']:,} rows, {m['tokens']:,} tokens ({m['windowed_rows']:,} rows in "
            f"{m['windows']:,} windows, {m['null_rows']:,} null) -> {out} ({len(m['shards'])} shards{kept}); "
            f"this run {run['tokens']:,} tokens in {run['seconds']:.1f} s = {run['tokens_per_second'] or 0:,.0f} tokens/s")
