"""OUTPUT_DIR claimed for one job: its job record read (``job_record``), compared with the job
(``check_claim``: new, resumed, restarted after a stopped run, or another job's) and written
(``claim_output_dir``); a stopped run marked (``mark_stopped``) and its shards dropped; the files a
resumed job would not write refused, its temporaries removed (``clean_strays``). The side files'
names and the shard commit protocol are ``pipelines.sink``'s.
"""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from elmo_core.errors import InputError

from .errors import OtherJobError, OutputDirError
from .options import output_options
from .shard_files import FORMATS, ShardFormat
from .sink import COMMITS_DIR, JOB, SUCCESS_FILE, Output, found_job_file, job_file, manifest_file, \
    remove_temporaries


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
        check_columns(out, fmt, schema)
        return out.read_record(job_file(fmt))["digest"]
    out.write_record(job_file(fmt), {**job, "digest": job_digest}, schema)
    return job_digest


def check_columns(out: Output, fmt: ShardFormat, schema: pa.Schema) -> None:
    """OtherJobError where the shards of the job resumed hold other columns than this run would write
    (an earlier version that read the inputs with other types: a CSV's ids as integers); judged
    before the model loads where the columns are known without it (``pipelines.claim_first``)."""
    name = job_file(fmt)
    theirs = out.read_schema(name)
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


def clean_strays(out: Output, expected: Callable[[str], bool], fmt: ShardFormat) -> list[str]:
    """Delete temporaries, refuse shards this job would not write; return the removed names."""
    for name in sorted(out.entries()):
        if not name.startswith(("_", ".")) and not expected(name):
            raise OutputDirError(f"{out}: {name} is not a shard of this job; move it away and rerun")
    removed = remove_temporaries(out)
    for name in (SUCCESS_FILE, manifest_file(fmt)):  # _SUCCESS first: it vouches for the manifest
        out.delete(name)
    return removed

