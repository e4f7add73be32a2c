"""The output side: shards written under a temporary name then renamed, the job file that makes
OUTPUT_DIR belong to one job, and the verification that makes ``--resume`` exactly once.

Layout of OUTPUT_DIR (everything but the shards starts with ``_`` or ``.``, so readers skip it):
  part-IIIII-KKKKK.parquet   shard K of input file I (see pipelines.source)
  .part-IIIII-KKKKK.parquet.tmp   a shard being written (deleted or redone on resume)
  _job.json                  the job's identity: input files, model sha256, options
  _manifest.json             counts, timing, options (written when every shard is done)
  _SUCCESS                   written last
Each shard's Parquet footer holds ``elmo.shard`` (JSON: job digest, input file and rows, counts),
checked on resume together with the footer's row count.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from .options import OutputDirError
from .schema import parquet_options
from .source import Shard

JOB_FILE, MANIFEST_FILE, SUCCESS_FILE = "_job.json", "_manifest.json", "_SUCCESS"
SHARD_KEY = b"elmo.shard"


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    _fsync(tmp)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """Streams one shard's tables to ``.NAME.tmp``; ``commit`` adds the footer record and renames."""

    def __init__(self, out_dir: Path, shard: Shard, schema: pa.Schema, job_digest: str) -> None:
        self.shard, self.job_digest = shard, job_digest
        self.final = out_dir / shard.name
        self.tmp = out_dir / f".{shard.name}.tmp"
        self.rows = self.tokens = self.windows = self.windowed_rows = self.null_rows = 0
        self.writer = pq.ParquetWriter(self.tmp, schema, **parquet_options(schema))

    def write(self, table: pa.Table, tokens: int, windows: int, windowed_rows: int) -> None:
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows += table.num_rows
        self.tokens += tokens
        self.windows += windows
        self.windowed_rows += windowed_rows
        self.null_rows += table.column(table.num_columns - 1).null_count

    def record(self) -> dict:
        s = self.shard
        return {"job": self.job_digest, "file": s.name, "input_file": s.file.index, "input_path": str(s.file.path),
                "row_start": s.start, "rows": self.rows, "tokens": self.tokens, "windows": self.windows,
                "windowed_rows": self.windowed_rows, "null_rows": self.null_rows}

    def commit(self) -> dict:
        if self.rows != self.shard.rows:
            self.abort()
            raise OutputDirError(f"{self.shard.name}: wrote {self.rows} rows, the input has {self.shard.rows}")
        record = self.record()
        self.writer.add_key_value_metadata({SHARD_KEY: json.dumps(record, sort_keys=True)})
        self.writer.close()
        _fsync(self.tmp)
        os.replace(self.tmp, self.final)
        return record

    def abort(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)


def shard_record(path: Path) -> dict | None:
    """The ``elmo.shard`` record of a finished shard, or None if the file is unreadable or lacks one."""
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError):
        return None
    raw = (meta.metadata or {}).get(SHARD_KEY)
    if raw is None:
        return None
    record = json.loads(raw)
    record["footer_rows"] = meta.num_rows
    return record


def verify_shard(path: Path, shard: Shard, job_digest: str) -> dict | None:
    """The shard's record if it is this job's, for these input rows, and complete; else None."""
    record = shard_record(path)
    if record is None:
        return None
    ok = (record.get("job") == job_digest and record.get("input_file") == shard.file.index
          and record.get("row_start") == shard.start and record.get("rows") == shard.rows
          and record.get("footer_rows") == shard.rows)
    return record if ok else None


def claim_output_dir(out_dir: Path, job: dict, job_digest: str, resume: bool) -> None:
    """Make OUTPUT_DIR this job's: refuse a non-empty one without --resume, and another job's always."""
    out_dir.mkdir(parents=True, exist_ok=True)
    job_path = out_dir / JOB_FILE
    visible = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("."))
    if job_path.is_file():
        theirs = json.loads(job_path.read_text())
        if theirs.get("digest") != job_digest:
            raise OutputDirError(f"{out_dir} holds another job's output ({_difference(theirs, job)}); "
                                 f"use another OUTPUT_DIR, or delete this one to start over")
        if not resume:
            raise OutputDirError(f"{out_dir} already holds this job's output; pass --resume to finish or "
                                 f"verify it, or use another OUTPUT_DIR")
        return
    if visible:
        raise OutputDirError(f"{out_dir} is not empty and holds no {JOB_FILE} ({visible[:5]}...); "
                             f"give an empty or new OUTPUT_DIR")
    write_json_atomic(job_path, {**job, "digest": job_digest})


def _difference(theirs: dict, ours: dict) -> str:
    diffs = [k for k in ("inputs", "model", "options") if theirs.get(k) != ours.get(k)]
    if "options" in diffs:
        a, b = theirs.get("options", {}), ours.get("options", {})
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        diffs[diffs.index("options")] = f"options {changed}"
    return "different " + ", ".join(diffs or ["job"])


def clean_strays(out_dir: Path, expected: Callable[[str], bool]) -> list[str]:
    """Delete temporaries, refuse shards this job would not write; return the removed names."""
    removed = []
    for p in sorted(out_dir.iterdir()):
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            p.unlink()
            removed.append(p.name)
        elif not p.name.startswith(("_", ".")) and not expected(p.name):
            raise OutputDirError(f"{out_dir}: {p.name} is not a shard of this job; move it away and rerun")
    for name in (MANIFEST_FILE, SUCCESS_FILE):
        (out_dir / name).unlink(missing_ok=True)
    return removed
