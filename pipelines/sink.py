"""The output side: shards committed once each, checksummed; the job record that makes OUTPUT_DIR
belong to one job; the verification that makes ``--resume`` exactly once. Written once for a local
OUTPUT_DIR and one on an object store (``pipelines.output_dir`` says how each makes a shard visible).

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

import os
import socket
from typing import Callable

import numpy as np
import pyarrow as pa

from elmo_core.errors import InputError
from inference.batching import window_counts

from .options import EmbedOptions, output_options

from .errors import OtherJobError, OutputDirError, ShardPublishedError
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
        self.writer.close(record)
        try:
            record.update(self.sink.finish(), writer=f"{socket.gethostname()}:{os.getpid()}")
        except ShardPublishedError:
            record = adopt_published(self.out, self.shard, self.job_digest, self.model_sha256)
        self.sink.publish()
        self.out.write_record(commit_name(self.shard.name), record, self.schema)
        return record

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


def job_record(out: Output) -> tuple[list[str], str | None, dict | None]:
    """(OUTPUT_DIR's entries but dot-files, the job record's name, the record) where OUTPUT_DIR is empty or
    holds a readable job record ((names, None, None) where it holds none); else OutputDirError. What
    ``check_claim`` decides from the directory alone, before it compares the record with the job."""
    names = sorted(n for n in out.entries() if not n.startswith("."))  # dot-files: lock, temporaries
    found = found_job_file(out, names)
    if found is None:
        if names:
            raise OutputDirError(f"{out} is not empty and holds no job record of elmo embed ({JOB}.parquet or "
                                 f"{JOB}.arrow; it holds {names[:5]}...); give an empty or new OUTPUT_DIR")
        return names, None, None
    try:
        return names, found, out.read_record(found)
    except InputError:
        raise OutputDirError(f"{out.where(found)}: not a valid job record; this OUTPUT_DIR was not written by "
                             f"elmo embed, or was damaged: delete it to start over") from None


def check_claim(out: Output, job: dict, job_digest: str, resume: bool) -> str:
    """What claiming OUTPUT_DIR for this job does, decided without writing: "new" (an empty or new
    directory), "resume" (this job's, with --resume: its record's digest is the job's, or its record
    describes the same inputs, model and output options, ``same_job``) or "restart" (a run of the
    same command that stopped on an input error, whose inputs were fixed since: its shards are
    dropped); else OutputDirError. Run before the model loads where the job's identity is known
    without it (``pipelines.claim_first``), before the lock, so that a refused job leaves nothing
    behind (no lock either), and again under it."""
    names, found, theirs = job_record(out)
    if found is None:
        return "new"
    if theirs.get("digest") == job_digest or same_job(theirs, job):
        if not resume:
            raise OutputDirError(f"{out} already holds this job's output; pass --resume to finish or "
                                 f"verify it, or use another OUTPUT_DIR")
        return "resume"
    if theirs.get("stopped") and SUCCESS_FILE not in names and theirs.get("model") == job.get("model") \
            and _output_options(theirs) == _output_options(job):
        return "restart"
    advice = "use another OUTPUT_DIR, or delete this one to start over"
    model, ours = theirs.get("model"), job.get("model") or {}
    if isinstance(model, dict) and model.get("path") == ours.get("path") and model != ours \
            and theirs.get("inputs") == job.get("inputs") and _output_options(theirs) == _output_options(job):
        unrecorded = sorted(set(ours) - set(model))
        if unrecorded and all(ours.get(k) == v for k, v in model.items()):  # all it recorded still holds
            advice = (f"an earlier version of elmo-pipeline started the job and did not record the model's "
                      f"{', '.join(unrecorded)}: finish it with that version, or {advice}")
        else:
            advice = (f"the files of the model {ours.get('path')} changed since the job started: restore them and "
                      f"rerun with --resume, or {advice}")
    raise OtherJobError(f"{out} holds another job's output ({_difference(theirs, job, found)}); {advice}")


def claim_output_dir(out: Output, job: dict, job_digest: str, resume: bool, fmt: ShardFormat,
                     schema: pa.Schema) -> str:
    """Make OUTPUT_DIR this job's (``check_claim``); return the digest the job goes on under (a
    resumed job's, as its record has it). The caller holds OUTPUT_DIR's lock."""
    how = check_claim(out, job, job_digest, resume)
    if how == "restart":
        drop_shards(out)
    if how == "resume":
        _check_columns(out, fmt, schema)
        return out.read_record(job_file(fmt))["digest"]
    out.write_record(job_file(fmt), {**job, "digest": job_digest}, schema)
    return job_digest


def _check_columns(out: Output, fmt: ShardFormat, schema: pa.Schema) -> None:
    """OtherJobError where the shards of the job resumed hold other columns than this run would write
    (an earlier version that read the inputs with other types: a CSV's ids as integers)."""
    name = job_file(fmt)
    theirs = fmt.schema(pa.BufferReader(out.read_bytes(name)))
    kinds = {f.name: f.type for f in theirs}
    differ = [f"'{f.name}' {kinds.get(f.name, 'missing')} there, {f.type} now" for f in schema
              if f.name not in kinds or not kinds[f.name].equals(f.type)]  # a list's item named alike or not
    if differ or len(kinds) != len(schema):
        raise OtherJobError(f"{out.where(name)}: the job's shards hold other columns than this run would write "
                            f"({'; '.join(differ) or 'other names'}): an earlier version of elmo-pipeline started it; "
                            f"finish it with that version, or use another OUTPUT_DIR")


def same_job(theirs: dict, ours: dict) -> bool:
    """Whether a job record describes the job ``ours`` describes: the same inputs, model and options
    that change the output (a record that also counted a runtime-only option, e.g. the engine, is
    the same job)."""
    return isinstance(theirs.get("digest"), str) and theirs.get("inputs") == ours.get("inputs") \
        and theirs.get("model") == ours.get("model") and _output_options(theirs) == _output_options(ours)


def _output_options(job: dict) -> dict | None:
    options = job.get("options")
    return output_options(options) if isinstance(options, dict) else None


def mark_stopped(out: Output, error: Exception, fmt: ShardFormat, schema: pa.Schema) -> None:
    """Record in the job record that the job stopped on an input error (``check_claim``'s "restart")."""
    record = out.read_record(job_file(fmt))
    out.write_record(job_file(fmt), {**record, "stopped": {"input_error": str(error)[:2000]}}, schema)


def drop_shards(out: Output) -> None:
    """Delete every shard and commit record (a stopped run's, whose inputs changed); refuse other files."""
    for name in sorted(n for n in out.entries() if not n.startswith(("_", "."))):
        if not (name.startswith("part-") and name.endswith(tuple(f.suffix for f in FORMATS.values()))):
            raise OutputDirError(f"{out}: {name} is not a shard of elmo embed; move it away and rerun")
        out.delete(name)
    for name in out.commit_names(COMMITS_DIR):
        out.delete(name)
    remove_temporaries(out)


def _difference(theirs: dict, ours: dict, where: str) -> str:
    diffs = [k for k in ("inputs", "model", "options") if theirs.get(k) != ours.get(k)]
    if "inputs" in diffs:
        a, b = theirs.get("inputs", []), ours.get("inputs", [])
        changed = sorted({i.get("path") for i in a} ^ {i.get("path") for i in b}
                         | {x.get("path") for x, y in zip(a, b) if x != y})
        diffs[diffs.index("inputs")] = f"inputs changed: {changed[:3]}"
    if _output_options(theirs) == _output_options(ours) and "options" in diffs:
        diffs.remove("options")
    if "model" in diffs and isinstance(theirs.get("model"), dict):
        a, b = theirs["model"], ours["model"]
        changed = [f"{k} {str(b.get(k))[:16]}... here, {str(a.get(k))[:16]}... in {where}" if "sha256" in k
                   else f"{k} {b.get(k)} here, {a.get(k)} in {where}" for k in sorted(set(a) | set(b))
                   if a.get(k) != b.get(k)]
        diffs[diffs.index("model")] = f"model: {'; '.join(changed)}"
    if "options" in diffs:
        a, b = _output_options(theirs) or {}, _output_options(ours) or {}
        changed = [f"`{k}` {_shown(b.get(k))} here, {_shown(a.get(k))} in {where}"
                   for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        diffs[diffs.index("options")] = f"options: {'; '.join(changed)}"
    return "different " + ", ".join(diffs or ["job"])


def _shown(value: object) -> str:
    """A setting's value as a message shows it: None (left to the run) as "not given", a list joined
    ("none" if empty), at most 40 characters."""
    text = "not given" if value is None else "none" if value == [] else \
        ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def remove_temporaries(out: Output) -> list[str]:
    """Delete the job's unfinished writes (temporary files here and under _shards/, a store's
    uncompleted uploads); return their names."""
    return out.remove_temporaries((COMMITS_DIR,))


def clean_strays(out: Output, expected: Callable[[str], bool], fmt: ShardFormat) -> list[str]:
    """Delete temporaries, refuse shards this job would not write; return the removed names."""
    for name in sorted(out.entries()):
        if not name.startswith(("_", ".")) and not expected(name):
            raise OutputDirError(f"{out}: {name} is not a shard of this job; move it away and rerun")
    removed = remove_temporaries(out)
    for name in (SUCCESS_FILE, manifest_file(fmt)):  # _SUCCESS first: it vouches for the manifest
        out.delete(name)
    return removed
