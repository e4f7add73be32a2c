"""The Ray Data runner (``--engine ray``): ``read_parquet -> map_batches(ElmoPredictor) -> write_parquet``, one input file
at a time, with the same predictor class, output schema and vectors as the local runner.

Unit of work and of resume: one input file. Its output is written by Ray into ``.ray-IIIII/``
(hidden from readers), then renamed in Ray's (order-preserving) task order to
``part-IIIII-KKKKK.parquet``, then committed by ``_ray-IIIII.json`` (file names and row counts).
On ``--resume`` a committed file whose shards all exist with those row counts is kept; anything
else of that input file is deleted and redone.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from elmo_core.errors import InputError

from .options import EmbedOptions
from .predictor import ElmoPredictor
from .progress import Progress
from .rows import row_tokens, window_spans
from .schema import COMPRESSION
from .sink import clean_strays, write_json_atomic
from .source import InputFile

SHARD_RE = re.compile(r"part-(\d{5})-(\d{5})\.parquet")


def _commit_path(out: Path, f: InputFile) -> Path:
    return out / f"_ray-{f.index:05d}.json"


def _kept(out: Path, f: InputFile, digest: str) -> dict | None:
    path = _commit_path(out, f)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.get("job") != digest or record.get("rows") != f.rows:
        return None
    for name, rows in record["parts"].items():
        try:
            if pq.read_metadata(out / name).num_rows != rows:
                return None
        except OSError:
            return None
    return record


def _counts(f: InputFile, opts: EmbedOptions) -> dict:
    """Token, window and null counts of an input file, counted on the driver from its text column."""
    text = opts.tokens_column or opts.text_column
    counts = {"tokens": 0, "windows": 0, "windowed_rows": 0, "null_rows": 0}
    for batch in pq.ParquetFile(f.path).iter_batches(columns=[text], batch_size=8192):
        for row in row_tokens(batch.column(0), opts.tokens_column is not None, text):
            if row is None:
                counts["null_rows"] += 1
                continue
            counts["tokens"] += len(row)
            n = len(window_spans(len(row), opts.max_sentence_length, opts.context))
            if n > 1:
                counts["windows"] += n
                counts["windowed_rows"] += 1
    return counts


def _init_ray(opts: EmbedOptions):
    try:
        import ray
    except ImportError:
        raise InputError("--engine ray needs Ray Data: pip install -e '.[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=opts.ray_address, include_dashboard=False, log_to_driver=not opts.quiet)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # rows and files in input order
    ctx.enable_progress_bars = not opts.quiet
    return ray


def _worker_cpus(ray, opts: EmbedOptions) -> float:
    """CPUs each model actor reserves: its torch threads, leaving one CPU for the read/write tasks
    (actors holding every CPU would starve them and the pipeline would stall)."""
    total = float(ray.cluster_resources().get("CPU", 1.0))
    return max(0.25, min(float(opts.threads or 1), (total - 1.0) / opts.workers))


def _embed_file(ray, job, f: InputFile, tmp: Path) -> None:
    opts: EmbedOptions = job.opts
    worker_opts = EmbedOptions.coerce(opts, threads=opts.threads or 1).to_dict()
    blocks = max(opts.workers, -(-f.rows // opts.sort_window_rows))  # so every worker gets work
    ds = ray.data.read_parquet(str(f.path), columns=opts.input_columns, override_num_blocks=blocks)
    if blocks > 1:  # Ray reads a file as one block; split it (text only, in order) to feed every worker
        ds = ds.repartition(blocks, shuffle=False)
    ds = ds.map_batches(ElmoPredictor, fn_constructor_args=(str(job.model),),
                        fn_constructor_kwargs={"options": worker_opts}, batch_size=opts.sort_window_rows,
                        batch_format="pyarrow", concurrency=opts.workers, num_cpus=_worker_cpus(ray, opts),
                        num_gpus=opts.num_gpus_per_worker or None)
    ds.write_parquet(str(tmp), compression=COMPRESSION, write_page_checksum=True)


def _part_index(path: Path) -> tuple:
    """Ray names files ``{uuid}_{task:06d}_{block:06d}-...``: order by the numbers it holds."""
    return tuple(int(n) for n in re.findall(r"_(\d{6})", path.name)) or (path.name,)


def run_ray(job, _shards: list, progress: Progress) -> tuple[list[dict], dict]:
    ray = _init_ray(job.opts)
    out: Path = job.out
    n_files = len(job.files)
    clean_strays(out, lambda name: bool(SHARD_RE.fullmatch(name)) and int(name[5:10]) < n_files)
    records = []
    for f in job.files:
        kept = _kept(out, f, job.digest)
        if kept is not None:
            job.kept.append(kept)
            progress.update(f.rows, 0)
            continue
        for stale in out.glob(f"part-{f.index:05d}-*.parquet"):
            stale.unlink()
        tmp = out / f".ray-{f.index:05d}"
        shutil.rmtree(tmp, ignore_errors=True)
        if f.rows:
            _embed_file(ray, job, f, tmp)
        parts = {}
        written = sorted(tmp.glob("*.parquet"), key=_part_index) if tmp.exists() else []
        for k, path in enumerate(written):
            name = f"part-{f.index:05d}-{k:05d}.parquet"
            parts[name] = pq.read_metadata(path).num_rows
            path.replace(out / name)
        shutil.rmtree(tmp, ignore_errors=True)
        if sum(parts.values()) != f.rows:
            raise InputError(f"{f.path}: Ray wrote {sum(parts.values())} rows, the file has {f.rows}")
        record = {"job": job.digest, "file": f"part-{f.index:05d}-*.parquet", "input_file": f.index,
                  "row_start": 0, "rows": f.rows, "parts": parts, **_counts(f, job.opts)}
        write_json_atomic(_commit_path(out, f), record)
        records.append(record)
        progress.update(f.rows, record["tokens"])
    return records, {"name": "ray", "workers": job.opts.workers, "ray_version": ray.__version__,
                     "num_gpus_per_worker": job.opts.num_gpus_per_worker}
