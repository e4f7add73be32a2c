"""The output side: shards committed once each, checksummed; the side files' names, among them the
job record that makes OUTPUT_DIR belong to one job (claimed in ``pipelines.claim``); the verification
that makes ``--resume`` exactly once. Written once for a local OUTPUT_DIR and one on an object store
(``pipelines.output_dir`` says how each makes a shard visible).

Layout of OUTPUT_DIR with ``--format parquet`` (``.arrow`` for ``--format arrow``):
  part-IIIII-KKKKK.parquet         shard K of input file I (see pipelines.source)
  .part-IIIII-KKKKK.parquet.*.tmp  a shard being written (local; deleted on failure and on resume)
  _shards/part-IIIII-KKKKK.parquet the shard's commit: the sha256 and size of its bytes (ETag on a
                                   store), its counts, the sha256 of the model that computed it
  _job.parquet                     the job's identity: input files, model sha256, options
  _manifest.parquet                counts, timing, options, every shard and its sha256 (at the end)
  _SUCCESS                         empty, written last, after every shard was verified
  .elmo.lock                       held by the running job (pipelines.lock, pipelines.store_lock),
                                   deleted when it finishes
The side records (``_shards/``, ``_job``, ``_manifest``) are files of the shard format with the
job's schema and no rows, each its JSON record in the schema's metadata (``shard_files``;
``Output.read_record``): every reader given the directory reads them as no rows, those that skip
``_`` and ``.`` names (pyarrow, pandas, Spark) do not open them, and polars, which opens every
non-empty file under a directory and wants one extension, finds one. Each shard's footer also
holds ``elmo.shard`` (job digest, input file, first row, rows, the model's sha256 as its writer
loaded it: a shard of another model than the job's is not the job's).
A shard counts as done only when its bytes match its commit record: ``--resume`` reads every byte
(on a store: the ETag the store gives every new version), ``elmo verify`` every byte everywhere, so
a torn or altered shard is found and redone. A shard is published first, by its first writer only
(``output_dir``), then its commit record is written; a later writer of the same shard (a retried or
speculative task) adopts the published one when its footer says it holds this job's rows, and
writes the record for it, so that the record always describes the bytes under the name. Once
``_SUCCESS`` is there, the ``part-*`` files are exactly the shards the manifest lists: a reader
of the directory reads this job's rows.
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator

import numpy as np
import pyarrow as pa

from elmo_core.errors import InputError
from inference.batching import window_counts

from .errors import OutputDirError, ShardPublishedError
from .options import EmbedOptions
from .output_dir import LocalDir, StoreDir
from .schema import conform
from .shard_files import FORMATS, ShardFormat, shard_format
from .source import Shard

JOB, MANIFEST, SUCCESS_FILE, COMMITS_DIR = "_job", "_manifest", "_SUCCESS", "_shards"  # side files' names
EARLIER_JOB_FILE = "_job.json"  # the job record of an elmo embed whose side records were JSON files
NO_RECORD = "no readable commit record"
COUNTS = ("rows", "tokens", "windows", "windowed_rows", "null_rows", "empty_rows", "invalid_utf8")


Output = LocalDir | StoreDir


def job_file(fmt: ShardFormat) -> str:
    return JOB + fmt.suffix


def manifest_file(fmt: ShardFormat) -> str:
    return MANIFEST + fmt.suffix


def commit_name(shard_name: str) -> str:
    """Shard ``shard_name``'s commit record: the same name, under ``_shards/``."""
    return f"{COMMITS_DIR}/{shard_name}"


def found_job_file(out: Output, names: list[str] | dict) -> str | None:
    """The job record among OUTPUT_DIR's top-level ``names`` (of either format), if any; OutputDirError
    where OUTPUT_DIR holds an earlier elmo embed's JSON side files instead."""
    if EARLIER_JOB_FILE in names:
        raise OutputDirError(f"{out.where(EARLIER_JOB_FILE)}: the job record of an earlier elmo embed, whose side "
                             f"files are JSON (polars cannot read such a directory), which this version neither "
                             f"resumes nor verifies: its shards (part-*) read as they are; to finish or verify it, use "
                             f"the version that wrote it, or embed into a new OUTPUT_DIR")
    return next((job_file(f) for f in FORMATS.values() if job_file(f) in names), None)


def side_names(out: Output) -> tuple[str, str] | None:
    """(the job record's name, the manifest's) in OUTPUT_DIR, by the format of the job record found
    there; None where there is none (``found_job_file``'s OutputDirError for an earlier one's)."""
    found = found_job_file(out, out.entries())
    return None if found is None else (found, MANIFEST + shard_format(found).suffix)


class ShardWriter:
    """Streams one shard's tables in the job's schema to its sink (``output_dir``); ``commit`` adds
    the footer record, checksums the bytes, makes the shard visible and writes its commit record."""

    def __init__(self, out: Output, shard: Shard, schema: pa.Schema, job_digest: str, opts: EmbedOptions,
                 model_sha256: str | None = None) -> None:
        self.out, self.shard, self.schema, self.job_digest, self.opts = out, shard, schema, job_digest, opts
        self.model_sha256 = model_sha256
        self.counts = dict.fromkeys(COUNTS, 0)
        self.sink = out.shard_sink(shard.name)
        self.writer = opts.shard_format.writer(self.sink.file, schema, opts.compression, self.identity())

    def write(self, table: pa.Table, lengths: np.ndarray, invalid_utf8: int = 0) -> None:
        """Shape: R rows of the shard, in input order, with the job's output columns; lengths (R,)
        each row's tokens (-1: null text)."""
        table = conform(table, self.schema)
        with self._naming_the_shard():
            self.writer.write(table)
            self.sink.written()
        windows, windowed = window_counts(lengths, self.opts.max_sentence_length, self.opts.context)
        for key, n in (("rows", table.num_rows), ("tokens", int(np.maximum(lengths, 0).sum())), ("windows", windows),
                       ("windowed_rows", windowed), ("null_rows", int((lengths < 0).sum())),
                       ("empty_rows", int((lengths == 0).sum())), ("invalid_utf8", invalid_utf8)):
            self.counts[key] += n

    def identity(self) -> dict:
        """What the shard is, known before its rows: the job, the input rows it holds, its model."""
        s = self.shard
        model = {"model_sha256": self.model_sha256} if self.model_sha256 else {}
        return {"job": self.job_digest, "file": s.name, "input_file": s.file.index, "input_path": str(s.file.path),
                "row_start": s.start, "rows": s.rows, **model}

    def commit(self) -> dict:
        try:
            if self.counts["rows"] != self.shard.rows:
                raise OutputDirError(f"{self.shard.name}: wrote {self.counts['rows']} rows, the input has "
                                     f"{self.shard.rows}")
            self.shard.file.check_unchanged()  # its rows came from the input the job pinned
        except (OutputDirError, InputError):
            self.abort()
            raise
        record = {**self.identity(), **self.counts}
        try:
            with self._naming_the_shard():
                self.writer.close(record)
                record.update(self.sink.finish(), writer=f"{socket.gethostname()}:{os.getpid()}")
        except ShardPublishedError:
            record = adopt_published(self.out, self.shard, self.job_digest, self.model_sha256)
        self.sink.publish()
        self.out.write_record(commit_name(self.shard.name), record, self.schema)
        return record

    @contextlib.contextmanager
    def _naming_the_shard(self) -> Iterator[None]:
        """An OS error of pyarrow's writer, which names no file ("Error writing bytes to file ...
        No space left on device"), named with the shard it was writing (``os_errors`` reports it)."""
        try:
            yield
        except OSError as e:
            if e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror or str(e), str(self.out.where(self.shard.name))) from e

    def abort(self) -> None:
        """Drop the partial shard (after a failure: closing may fail too, e.g. on a full disk)."""
        try:
            self.writer.close()
        except OSError:
            pass  # the bytes are dropped next; a full disk cannot flush them
        self.sink.abort()


def footer_record(out: Output, name: str) -> dict | None:
    """The ``elmo.shard`` record a shard file carries (plus the rows it holds), or None if unreadable
    (``shard_files``)."""
    try:
        with out.open_read(name) as f:
            record, rows = shard_format(name).footer(f)
    except (pa.ArrowInvalid, pa.ArrowException, OSError, InputError):
        return None
    return {**record, "footer_rows": rows} if record is not None else None


def adopt_published(out: Output, shard: Shard, job_digest: str, model_sha256: str | None = None) -> dict:
    """The commit record of a shard another writer of this job published first (its footer says so;
    else OutputDirError: a file that is not this job's holds the name)."""
    footer = footer_record(out, shard.name)
    if not _describes(footer, job_digest, shard.file.index, shard.start, shard.rows) \
            or other_model(footer, model_sha256):
        raise OutputDirError(f"{out.where(shard.name)}: holds a file that is not this job's shard; move it away and "
                             f"rerun with --resume")
    if any(k not in footer for k in COUNTS):  # an earlier version's Arrow shard: its identity only
        raise OutputDirError(f"{out.where(shard.name)}: its footer lacks the shard's counts (an earlier version's); "
                             f"delete it and rerun with --resume")
    record = {k: v for k, v in footer.items() if k != "footer_rows"}
    record.update(sha256=out.sha256(shard.name), bytes=out.size(shard.name), writer="adopted")
    if out.is_store:
        record["etag"] = out.head(shard.name)["ETag"]
    return record


def _describes(footer: dict | None, job_digest: str, file_index: int, row_start: int, rows: int) -> bool:
    """Whether a shard's footer record says it holds this job's input rows."""
    want = {"job": job_digest, "input_file": file_index, "row_start": row_start, "rows": rows}
    return footer is not None and footer.get("footer_rows") == rows and all(footer.get(k) == v for k, v in want.items())


def read_commit(out: Output, name: str) -> dict | None:
    """Shard ``name``'s commit record, or None where there is no readable one."""
    try:
        return out.read_record(commit_name(name))
    except (OSError, InputError):
        return None


def other_model(record: dict, model_sha256: str | None) -> str | None:
    """The sha256 of the model a shard's record (footer or commit) says computed it, where it is not
    ``model_sha256`` (the job's); None where it is, or the record predates recording it."""
    found = record.get("model_sha256", model_sha256)
    return None if model_sha256 is None or found == model_sha256 else str(found)


def check_shard(out: Output, name: str, job_digest: str, file_index: int, row_start: int, rows: int,
                every_byte: bool = True, model_sha256: str | None = None) -> tuple[dict | None, str]:
    """(commit record, "") if shard ``name`` is this job's, for these input rows, computed by the
    job's model (``model_sha256``), complete and what was committed (``every_byte``: its sha256, else
    what the output checks cheaply); else (None, why not)."""
    record = read_commit(out, name)
    if record is None:
        return None, NO_RECORD
    if every_byte:
        if out.size(name) != record.get("bytes"):
            return None, "missing, or its size differs from its commit record"
        if out.sha256(name) != record.get("sha256"):
            return None, "its bytes differ from its commit record (sha256)"
    elif not out.unchanged(name, record):
        return None, "missing, or not the version its commit record describes (size, ETag)"
    footer = footer_record(out, name)
    want = {"job": job_digest, "input_file": file_index, "row_start": row_start, "rows": rows}
    if not _describes(footer, job_digest, file_index, row_start, rows) \
            or any(record.get(k) != v for k, v in want.items()):
        return None, "its footer or commit record does not describe this job's rows"
    other = other_model(footer, model_sha256) or other_model(record, model_sha256)
    if other:
        return None, (f"computed with another model (sha256 {other[:16]}...) than the job's ({model_sha256[:16]}..., "
                      f"{job_file(shard_format(name))})")
    return record, ""


def verify_shard(out: Output, shard: Shard, job_digest: str, schema: pa.Schema,
                 model_sha256: str | None = None) -> dict | None:
    """The shard's commit record if it is done (see ``check_shard``; on a store by its ETag), else
    None. A shard published without its record (its writer killed between the two) is adopted when
    its footer says it holds this job's rows: its record is written from its bytes."""
    record, why = check_shard(out, shard.name, job_digest, shard.file.index, shard.start, shard.rows,
                              every_byte=not out.is_store, model_sha256=model_sha256)
    if why == NO_RECORD:
        try:
            record = adopt_published(out, shard, job_digest, model_sha256)
        except OutputDirError:
            return None
        out.write_record(commit_name(shard.name), record, schema)
    return record


def discard_shard(out: Output, name: str) -> None:
    out.delete(name)
    out.delete(commit_name(name))


def remove_temporaries(out: Output) -> list[str]:
    """Delete the job's unfinished writes (temporary files here and under _shards/, a store's
    uncompleted uploads); return their names."""
    return out.remove_temporaries((COMMITS_DIR,))
