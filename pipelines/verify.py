"""``elmo verify --out OUTPUT_DIR``: check a finished ``elmo embed`` output without recomputing vectors.

What is checked: ``_SUCCESS``, the job record and the manifest (``_job.parquet``, ``_manifest.parquet``;
``.arrow`` for an Arrow output) agree (the job record's digest is its contents'; the manifest's
inputs, model and output options are the job's); every shard listed is there, no other file is
(no ``part-*``, and no ``_`` name but the job's own: polars and DuckDB read every file under the
directory); the counts are the shards' own (each shard's rows, tokens and null rows counted from
its vectors against its commit record and the manifest, the manifest's totals against the sum;
a pooled output's tokens are not in its shards: its records' are summed); each shard's bytes match the sha256 committed for it and its
footer describes its input rows and the job's model (the sha256 its writer loaded); per input file, the shards cover rows 0..N-1 once, in name
order. Where the input files are still there unchanged (same size, mtime and footer), each output
row is matched to its input row: the same id (with ``--id-column``) and as many vectors as the
row has tokens (null for null), which shows every row is in input order.

Every problem found is reported, one line each (a damaged file is a problem, not a crash); the
rows of a shard that failed its checksum are not read.
"""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.errors import ElmoError, InputError
from inference.outputs import non_finite_rows
from storage.atomic import digest
from storage.locations import dataset_source, file_info, is_hidden

from .options import EmbedOptions, output_options

from .errors import OutputDirError
from .output_dir import open_output
from .rows import row_tokens
from .schema import ELMO_COLUMN, vector_array
from .shard_files import FORMATS, shard_format
from .sink import COMMITS_DIR, SUCCESS_FILE, Output, check_shard, job_file, manifest_file, side_names
from . import input_formats
from .source import input_sha256


class VerificationError(OutputDirError):
    """An output that is not what its job committed; ``problems``: each, one line."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


JOB_KEYS = {"digest": str, "inputs": list}
# keys a job adds to its record once it holds OUTPUT_DIR (``pipelines.job``, ``claim.mark_stopped``): not in its digest
ADDED_AFTER_CLAIM = ("digest", "stopped", "input_sha256")
MANIFEST_KEYS = {"job_digest": str, "shards": list, "options": dict, "rows": int, "tokens": int}
SHARD_KEYS = {"file": str, "input_file": int, "row_start": int, "rows": int}
INPUT_KEYS = {"path": str, "rows": int, "bytes": int, "mtime_ns": int, "footer_sha256": str}


def _record(out: Output, name: str, keys: dict[str, type], problems: list[str]) -> dict | None:
    """A JSON object with these keys and types, or None with the problem added."""
    try:
        obj = out.read_record(name)
        why = f"{name}: {shape}" if (shape := _shape_problem(obj, keys)) else ""
    except FileNotFoundError:
        why = (f"{name}: missing; is this a finished elmo embed OUTPUT_DIR? (a job that did not finish: rerun it "
               f"with --resume)")
    except InputError as e:
        why = str(e)
    if why:
        problems.append(why)
        return None
    return obj


def _shape_problem(obj: object, keys: dict[str, type]) -> str:
    wrong = [k for k, t in keys.items() if not isinstance(obj.get(k), t) or isinstance(obj.get(k), bool)]
    return f"{', '.join(wrong)} missing or of the wrong type" if wrong else ""


def _shard_problems(out: Output, manifest: dict, job: dict, good: set[str], job_name: str,
                    manifest_name: str) -> list[str]:
    """The shards' problems; ``good`` receives the names of the shards that passed."""
    model = job.get("model")
    model_sha256 = model.get("sha256") if isinstance(model, dict) and isinstance(model.get("sha256"), str) else None
    listed = {s["file"]: s for s in manifest["shards"]}
    problems, on_disk = _layout_problems(out, listed, job_name, manifest_name)
    totals: dict[str, int] = {}
    for name, s in sorted(listed.items()):
        if name not in on_disk:
            continue
        why, counted = _shard_counts(out, name, s, job["digest"], model_sha256, manifest_name)
        if why:
            problems.append(f"{name}: {why}")
            continue
        good.add(name)
        totals.update({k: totals.get(k, 0) + v for k, v in counted.items()})
    for k in ("rows", "tokens"):
        if len(good) == len(listed) and totals.get(k, 0) != manifest[k]:
            problems.append(f"{manifest_name}: {k} {manifest[k]:,}, and its shards hold {totals.get(k, 0):,}")
    return problems + _coverage_problems(job["inputs"], listed)


def _layout_problems(out: Output, listed: dict[str, dict], job_name: str,
                     manifest_name: str) -> tuple[list[str], set[str]]:
    """What is in OUTPUT_DIR that should not be, or missing from it; and the shard files on disk."""
    entries = out.entries()
    side = {job_name, manifest_name, SUCCESS_FILE, COMMITS_DIR}
    problems = [f"{n}{'/' if is_dir else ''}: not a file of this job; polars and DuckDB read every file under "
                f"OUTPUT_DIR (pyarrow, pandas and Spark skip '_' names): move it out" for n, is_dir in
                sorted(entries.items()) if n.startswith("_") and n not in side]
    problems += [f"{n}: not the commit record of a shard of this job; polars reads every file under OUTPUT_DIR: "
                 f"move it out" for n in out.commit_names(COMMITS_DIR) if n.split("/", 1)[1] not in listed]
    visible = {n: is_dir for n, is_dir in entries.items() if not is_hidden(n)}  # what readers read
    problems += [f"{n}: a directory where a shard should be" for n, is_dir in sorted(visible.items())
                 if is_dir and n in listed]
    problems += [f"{n}: listed in {manifest_name} but missing" for n in sorted(set(listed) - set(visible))]
    problems += [f"{n}{'/' if visible[n] else ''}: not a shard of this job, and readers of OUTPUT_DIR would read "
                 f"it as one: move it out of OUTPUT_DIR" for n in sorted(set(visible) - set(listed))]
    return problems, {n for n, is_dir in visible.items() if not is_dir}


def _shard_counts(out: Output, name: str, s: dict, digest: str, model_sha256: str | None,
                  manifest_name: str) -> tuple[str, dict[str, int]]:
    """One listed shard checked against its commit record and the manifest's entry ``s``: (what is
    wrong, "" where nothing; its counts)."""
    record, why = check_shard(out, name, digest, s["input_file"], s["row_start"], s["rows"],
                              model_sha256=model_sha256)
    if record is None or record.get("sha256") != s.get("sha256"):
        return why or f"its commit record differs from {manifest_name}", {}
    why, counted = _scan(out, name)
    if why:
        return why, counted
    if "tokens" not in counted and isinstance(record.get("tokens"), int):  # pooled: the record's, summed
        counted["tokens"] = record["tokens"]
    # a count an earlier version's records lack is not compared
    if differ := [f"{k} {v:,} in its vectors, {record.get(k)} in its commit record, {s.get(k, v)} in "
                  f"{manifest_name}" for k, v in counted.items() if v != record.get(k, v) or v != s.get(k, v)]:
        return f"its counts differ: {'; '.join(differ)}", counted
    return "", counted


def _coverage_problems(inputs: list[dict], listed: dict[str, dict]) -> list[str]:
    """Each input's rows in exactly one shard."""
    problems = []
    for i, inp in enumerate(inputs):
        starts = sorted((s["row_start"], s["rows"]) for s in listed.values() if s["input_file"] == i)
        covered = 0
        for start, rows in starts:
            if start != covered:
                problems.append(f"input {inp['path']}: rows {covered}..{start - 1} are in no shard, or twice")
            covered = max(covered, start + rows)
        if covered != inp["rows"]:
            problems.append(f"input {inp['path']}: shards cover {covered} of its {inp['rows']} rows")
    return problems


def _scan(out: Output, name: str) -> tuple[str, dict[str, int]]:
    """One pass over a shard's vectors, a row group or record batch at a time: the first row whose
    vectors hold inf or NaN, in words ("" where every value is finite; null rows hold none), and
    what the shard holds: its rows, its null rows and (not pooled: a vector a token) its tokens."""
    counted = {"rows": 0, "null_rows": 0}
    with out.open_read(name) as f:
        for batch in shard_format(name).batches(f, [ELMO_COLUMN]):
            column, row = batch.column(0), counted["rows"]
            vectors = vector_array(column, batch.schema.field(0))  # (tokens or pooled rows, ...)
            per_row = pa.types.is_list(column.type)  # else pooled: one vector a row
            rows = np.repeat(np.arange(len(column)), pc.list_value_length(column).fill_null(0).to_numpy()) \
                if per_row else np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
            bad = np.flatnonzero(non_finite_rows(vectors.reshape(len(rows), -1))) if len(rows) else rows
            if bad.size:
                return (f"its row {row + int(rows[bad[0]])} holds inf or NaN ({bad.size} vectors of its next "
                        f"{len(column)} rows); rerun the job into a new OUTPUT_DIR with a smaller --gamma"), counted
            counted["rows"] += len(column)
            if per_row:
                counted["null_rows"] += column.null_count
                counted["tokens"] = counted.get("tokens", 0) + len(rows)
            else:  # a pooled row is null for a null row and for an empty one: not the record's count
                counted.pop("null_rows", None)
    return "", counted


def _read_input(inp: dict, columns: list[str], opts: EmbedOptions) -> pa.Table:
    fmt = inp.get("format", "parquet")
    if fmt != "parquet":
        return input_formats.read_table(inp["path"], fmt, opts.text_column, columns)
    path, fs = dataset_source(inp["path"])  # a local path or a URI
    return pq.read_table(path, columns=columns, filesystem=fs)


def _unchanged(inp: dict) -> bool:
    info = file_info(inp["path"])  # a local path or a URI
    return info == (inp["bytes"], inp["mtime_ns"]) and \
        input_sha256(inp["path"], inp.get("format", "parquet")) == inp["footer_sha256"]


def _row_problems(out: Output, shard: dict, inp: dict, inputs: pa.Table, opts: EmbedOptions) -> list[str]:
    """Each output row against its input row: the id, and the vector count against the token count."""
    text = opts.tokens_column or opts.text_column
    source = inputs.slice(shard["row_start"], shard["rows"])
    got = out.read_table(shard["file"], [c for c in (opts.id_column, ELMO_COLUMN) if c])
    problems = []
    if opts.id_column and not _same_values(got.column(opts.id_column).to_pylist(),
                                           _as_written(source.column(opts.id_column), got.column(opts.id_column).type)):
        problems.append(f"{shard['file']}: its {opts.id_column} column is not the input's rows "
                        f"{shard['row_start']}.. in order")
    tokens, _ = row_tokens(source.column(text), opts.tokens_column is not None, text)
    want = np.array([-1 if t is None else len(t) for t in tokens])
    column = got.column(ELMO_COLUMN)
    if opts.vectors.pool:  # one vector per row: present exactly where the row has tokens
        want = np.where(want > 0, 1, -1)
        have = np.where(column.is_null().to_numpy(zero_copy_only=False), -1, 1)
    else:
        have = pc.list_value_length(column).fill_null(-1).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(want != have)
    if bad.size:
        problems.append(f"{shard['file']}: row {shard['row_start'] + int(bad[0])} of {inp['path']} has "
                        f"{want[bad[0]]} tokens but {have[bad[0]]} vectors ({bad.size} rows differ)")
    return problems


def _as_written(column: pa.ChunkedArray, written: pa.DataType) -> list:
    """An input column's values as a shard of ``written``'s type holds them: an earlier version typed
    a CSV's columns by inference (its ids 1, 2 where they are read now as "1", "2")."""
    if not column.type.equals(written):
        if pa.types.is_string(column.type) and not pa.types.is_string(written):  # it read an empty field as null
            column = pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)
        try:
            column = column.cast(written)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # not that version's typing: the values differ
    return column.to_pylist()


def _same_values(a: list, b: list) -> bool:
    """Equal lists, a NaN equal to a NaN (a float id column may hold NaN, which equals nothing)."""
    return a == b or (len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b)))


def verify_output(out_dir: str | Path, check_inputs: bool = True) -> dict:
    """A report of a finished output; raises VerificationError listing every problem found."""
    out = open_output(out_dir)
    _check_found(out)
    problems: list[str] = []
    try:  # its job record's format names its manifest; by default a Parquet output's, reported missing
        job_name, manifest_name = side_names(out) or (job_file(FORMATS["parquet"]), manifest_file(FORMATS["parquet"]))
    except OutputDirError as e:
        raise VerificationError(str(e)) from None
    job, manifest = _record(out, job_name, JOB_KEYS, problems), _record(out, manifest_name, MANIFEST_KEYS, problems)
    if out.size(SUCCESS_FILE) is None:
        problems.append(f"{SUCCESS_FILE} is missing: the job did not finish")
    if job is None or manifest is None:
        _raise(out, problems)
    malformed = (_entry_problems(manifest["shards"], SHARD_KEYS, f"{manifest_name}: shard")
                 + _entry_problems(job["inputs"], INPUT_KEYS, f"{job_name}: input"))
    if malformed:
        _raise(out, problems + malformed)
    problems += _record_problems(job, manifest, job_name, manifest_name)
    good: set[str] = set()
    problems += _shard_problems(out, manifest, job, good, job_name, manifest_name)
    try:
        opts = EmbedOptions.coerce(manifest["options"], resume=False)
    except (ElmoError, TypeError, ValueError) as e:
        _raise(out, problems + [f"{manifest_name}: options are not elmo embed's ({e})"])
    checked, skipped, passed = 0, [], [s for s in manifest["shards"] if s["file"] in good]
    for i, inp in enumerate(job["inputs"]):
        if not check_inputs or not _unchanged(inp):
            skipped.append(inp["path"])
            continue
        problems += _input_problems(out, i, inp, passed, opts)
        checked += 1
    if problems:
        _raise(out, problems)
    return {"ok": True, "shards": len(manifest["shards"]), "rows": manifest["rows"], "tokens": manifest["tokens"],
            "inputs_checked": checked, "inputs_not_checked": skipped}


def _check_found(out: Output) -> None:
    """VerificationError where OUTPUT_DIR is not there (or is a file: an hdf5 output's)."""
    if out.exists():
        return
    if out.is_store:
        raise VerificationError(f"{out}: no object under this prefix; give the OUTPUT_DIR elmo embed wrote")
    what = "a file" if Path(str(out)).is_file() else "not found"
    raise VerificationError(f"{out}: {what}; elmo verify reads the OUTPUT_DIR of an elmo embed job (Parquet or "
                            f"Arrow shards: an hdf5 output is one file, published whole, with nothing to verify)")


def _record_problems(job: dict, manifest: dict, job_name: str, manifest_name: str) -> list[str]:
    """The job record and the manifest against each other: the same job, inputs, model and options,
    the job record unedited."""
    problems = []
    if manifest["job_digest"] != job["digest"]:
        problems.append(f"{manifest_name} is another job's than {job_name}")
    if digest({k: v for k, v in job.items() if k not in ADDED_AFTER_CLAIM}) != job["digest"]:
        problems.append(f"{job_name}: its digest is not its contents' (the record was edited)")
    for key, mine, theirs in (("inputs", manifest.get("inputs"), job["inputs"]), ("model", manifest.get("model"), job.get("model"))):
        if mine != theirs:
            problems.append(f"{manifest_name}: its {key} are not {job_name}'s")
    ours, theirs = output_options(manifest["options"]), job.get("options")  # the job's: also the run's settled values
    if isinstance(theirs, dict) and (edited := sorted(k for k, v in output_options(theirs).items() if ours.get(k, v) != v)):
        problems.append(f"{manifest_name}: its options {edited} are not {job_name}'s")
    return problems


def _input_problems(out: Output, i: int, inp: dict, shards: list[dict], opts: EmbedOptions) -> list[str]:
    """Input ``i``'s rows against those of ``shards`` (the good ones) that hold them."""
    columns = list(dict.fromkeys(c for c in (opts.id_column, opts.tokens_column or opts.text_column) if c))  # an id may be the text
    inputs = _read_input(inp, columns, opts)
    return [p for shard in shards if shard["input_file"] == i for p in _row_problems(out, shard, inp, inputs, opts)]


def _entry_problems(entries: list, keys: dict[str, type], what: str) -> list[str]:
    return [f"{what} {k} is malformed: {why}" for k, e in enumerate(entries) if (why := _shape_problem(e, keys))]


def _raise(out: Output, problems: list[str]) -> NoReturn:
    raise VerificationError(f"{out}: {len(problems)} problem(s):\n  " + "\n  ".join(problems), problems)
