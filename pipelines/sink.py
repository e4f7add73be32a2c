"""The output side: shards written under a temporary name, checksummed, then renamed; the job file
that makes OUTPUT_DIR belong to one job; the verification that makes ``--resume`` exactly once.

Layout of OUTPUT_DIR (everything but the shards starts with ``_`` or ``.``, so readers skip it):
  part-IIIII-KKKKK.parquet         shard K of input file I (see pipelines.source)
  .part-IIIII-KKKKK.parquet.tmp    a shard being written (deleted on failure and on resume)
  _shards/part-IIIII-KKKKK.json    the shard's commit: the sha256 and size of its bytes, its counts
  _job.json                        the job's identity: input files, model sha256, options
  _manifest.json                   counts, timing, options, every shard and its sha256 (at the end)
  _SUCCESS                         written last, after every shard was verified
  .elmo.lock                       held by the running job (pipelines.lock)
Each shard's Parquet footer also holds ``elmo.shard`` (job digest, input file, first row, rows).
A shard counts as done only when its bytes match its commit record: ``--resume`` and
``elmo verify`` read every byte, so a torn or altered shard is found and redone.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from elmo_core.atomic import TMP_GLOB, fsync, write_json_atomic
from elmo_core.model_io import file_sha256
from inference.batching import window_counts

from .options import EmbedOptions, OutputDirError
from .schema import conform, parquet_options
from .source import Shard

JOB_FILE, MANIFEST_FILE, SUCCESS_FILE, COMMITS_DIR = "_job.json", "_manifest.json", "_SUCCESS", "_shards"
SHARD_KEY = b"elmo.shard"
COUNTS = ("rows", "tokens", "windows", "windowed_rows", "null_rows", "empty_rows", "invalid_utf8")


def commit_path(out_dir: Path, shard_name: str) -> Path:
    return out_dir / COMMITS_DIR / f"{shard_name.removesuffix('.parquet')}.json"


class ShardWriter:
    """Streams one shard's tables to ``.NAME.tmp`` in the job's schema; ``commit`` adds the footer
    record, checksums the file, writes its commit record and renames it."""

    def __init__(self, out_dir: Path, shard: Shard, schema: pa.Schema, job_digest: str, opts: EmbedOptions) -> None:
        self.out, self.shard, self.schema, self.job_digest, self.opts = out_dir, shard, schema, job_digest, opts
        self.final = out_dir / shard.name
        self.tmp = out_dir / f".{shard.name}.tmp"
        self.counts = dict.fromkeys(COUNTS, 0)
        self.writer = pq.ParquetWriter(self.tmp, schema, **parquet_options(schema, opts.compression))

    def write(self, table: pa.Table, lengths: np.ndarray, invalid_utf8: int = 0) -> None:
        """Shape: R rows of the shard, in input order, with the job's output columns; lengths (R,)
        each row's tokens (-1: null text)."""
        table = conform(table, self.schema)
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        windows, windowed = window_counts(lengths, self.opts.max_sentence_length, self.opts.context)
        for key, n in (("rows", table.num_rows), ("tokens", int(np.maximum(lengths, 0).sum())), ("windows", windows),
                       ("windowed_rows", windowed), ("null_rows", int((lengths < 0).sum())),
                       ("empty_rows", int((lengths == 0).sum())), ("invalid_utf8", invalid_utf8)):
            self.counts[key] += n

    def footer_record(self) -> dict:
        s = self.shard
        return {"job": self.job_digest, "file": s.name, "input_file": s.file.index, "input_path": str(s.file.path),
                "row_start": s.start, **self.counts}

    def commit(self) -> dict:
        if self.counts["rows"] != self.shard.rows:
            self.abort()
            raise OutputDirError(f"{self.shard.name}: wrote {self.counts['rows']} rows, the input has {self.shard.rows}")
        record = self.footer_record()
        self.writer.add_key_value_metadata({SHARD_KEY: json.dumps(record, sort_keys=True)})
        self.writer.close()
        fsync(self.tmp)
        record.update(sha256=file_sha256(self.tmp), bytes=self.tmp.stat().st_size,
                      writer=f"{socket.gethostname()}:{os.getpid()}")
        commit = commit_path(self.out, self.shard.name)
        commit.parent.mkdir(exist_ok=True)
        write_json_atomic(commit, record)
        os.replace(self.tmp, self.final)
        fsync(self.out)
        return record

    def abort(self) -> None:
        """Drop the temporary file (after a failure: closing may fail too, e.g. on a full disk)."""
        try:
            self.writer.close()
        except OSError:
            pass  # the file is deleted next; a full disk cannot flush it
        self.tmp.unlink(missing_ok=True)


def footer_record(path: Path) -> dict | None:
    """The ``elmo.shard`` record of a shard's footer (plus its row count), or None if unreadable."""
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError):
        return None
    raw = (meta.metadata or {}).get(SHARD_KEY)
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return {**record, "footer_rows": meta.num_rows} if isinstance(record, dict) else None


def check_shard(out_dir: Path, name: str, job_digest: str, file_index: int, row_start: int, rows: int) -> tuple[dict | None, str]:
    """(commit record, "") if shard ``name`` is this job's, for these input rows, complete and
    byte-for-byte what was committed; else (None, why not)."""
    path, commit = out_dir / name, commit_path(out_dir, name)
    try:
        record = json.loads(commit.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return None, "no readable commit record"
    if not path.is_file() or path.stat().st_size != record.get("bytes"):
        return None, "missing, or its size differs from its commit record"
    if file_sha256(path) != record.get("sha256"):
        return None, "its bytes differ from its commit record (sha256)"
    footer = footer_record(path)
    want = {"job": job_digest, "input_file": file_index, "row_start": row_start, "rows": rows}
    if footer is None or footer.get("footer_rows") != rows or any(footer.get(k) != v for k, v in want.items()) \
            or any(record.get(k) != v for k, v in want.items()):
        return None, "its footer or commit record does not describe this job's rows"
    return record, ""


def verify_shard(out_dir: Path, shard: Shard, job_digest: str) -> dict | None:
    """The shard's commit record if it is done (see ``check_shard``), else None."""
    return check_shard(out_dir, shard.name, job_digest, shard.file.index, shard.start, shard.rows)[0]


def discard_shard(out_dir: Path, name: str) -> None:
    (out_dir / name).unlink(missing_ok=True)
    commit_path(out_dir, name).unlink(missing_ok=True)


def claim_output_dir(out_dir: Path, job: dict, job_digest: str, resume: bool) -> None:
    """Make OUTPUT_DIR this job's: refuse a non-empty one without --resume, and another job's always.
    The caller holds OUTPUT_DIR's lock."""
    job_path = out_dir / JOB_FILE
    names = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("."))  # dot-files: lock, temporaries
    if job_path.is_file():
        try:
            theirs = json.loads(job_path.read_text())
        except ValueError:
            raise OutputDirError(f"{job_path}: not valid JSON; this OUTPUT_DIR was not written by elmo embed, or "
                                 f"was damaged: delete it to start over") from None
        if theirs.get("digest") != job_digest:
            raise OutputDirError(f"{out_dir} holds another job's output ({_difference(theirs, job)}); "
                                 f"use another OUTPUT_DIR, or delete this one to start over")
        if not resume:
            raise OutputDirError(f"{out_dir} already holds this job's output; pass --resume to finish or "
                                 f"verify it, or use another OUTPUT_DIR")
        return
    if names:
        raise OutputDirError(f"{out_dir} is not empty and holds no {JOB_FILE} ({names[:5]}...); "
                             f"give an empty or new OUTPUT_DIR")
    write_json_atomic(job_path, {**job, "digest": job_digest})


def _difference(theirs: dict, ours: dict) -> str:
    diffs = [k for k in ("inputs", "model", "options") if theirs.get(k) != ours.get(k)]
    if "inputs" in diffs:
        a, b = theirs.get("inputs", []), ours.get("inputs", [])
        changed = sorted({i.get("path") for i in a} ^ {i.get("path") for i in b}
                         | {x.get("path") for x, y in zip(a, b) if x != y})
        diffs[diffs.index("inputs")] = f"inputs changed: {changed[:3]}"
    if "options" in diffs:
        a, b = theirs.get("options", {}), ours.get("options", {})
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        diffs[diffs.index("options")] = f"options {changed}"
    return "different " + ", ".join(diffs or ["job"])


def remove_temporaries(out_dir: Path) -> list[str]:
    """Delete the job's temporary files (``.*.tmp``, here and under _shards/); return their names."""
    found = [p for d in (out_dir, out_dir / COMMITS_DIR) if d.is_dir() for p in d.glob(TMP_GLOB)]
    for p in found:
        p.unlink(missing_ok=True)
    return sorted(str(p.relative_to(out_dir)) for p in found)


def clean_strays(out_dir: Path, expected: Callable[[str], bool]) -> list[str]:
    """Delete temporaries, refuse shards this job would not write; return the removed names."""
    for p in sorted(out_dir.iterdir()):
        if not p.name.startswith(("_", ".")) and not expected(p.name):
            raise OutputDirError(f"{out_dir}: {p.name} is not a shard of this job; move it away and rerun")
    removed = remove_temporaries(out_dir)
    for name in (MANIFEST_FILE, SUCCESS_FILE):
        (out_dir / name).unlink(missing_ok=True)
    return removed
