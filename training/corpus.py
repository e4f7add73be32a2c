"""Streamed corpus readers: text (one whitespace-tokenized sentence a line, .gz too) and Parquet.

A corpus is a file, a directory of shards or a glob. Records are read lazily, one shard at a time,
so the corpus is never in memory whole. Invalid UTF-8 bytes are dropped (as the original does with
``errors="ignore"``) and counted; empty records are skipped and counted by the caller.
"""
from __future__ import annotations

import glob
import gzip
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from corpora.files import check_name, decode_utf8, input_format, is_parquet
from elmo_core.bounds import check_count
from elmo_core.errors import SettingError
from elmo_core.whitespace import split_tokens

from .errors import CorpusError

TOKEN_COLUMNS = ("tokens", "text", "sentence")


@dataclass
class CorpusStats:
    """Counts over what has been read so far (per pass over the corpus)."""

    sentences: int = 0
    tokens: int = 0
    empty: int = 0
    invalid_utf8: int = 0


def list_shards(path: str | Path) -> list[Path]:
    """The shard files of a corpus: a file, every non-hidden file of a directory, or a glob; each
    named in UTF-8 and none a table of another format (CSV, TSV, JSON lines: refused, not read as
    lines of text)."""
    shards = _shards(path)
    for shard in shards:
        check_name(shard)
        if (kind := input_format(shard.with_suffix("") if shard.suffix == ".gz" else shard)) not in (None, "text", "parquet"):
            raise CorpusError(f"{shard}: a {kind} file; a training corpus is text (one sentence a line, .txt or "
                              f".gz) or Parquet (--text-column): convert it to one of them")
    return shards


def _shards(path: str | Path) -> list[Path]:
    text = str(path)
    if any(ch in text for ch in "*?["):
        shards = sorted(Path(p) for p in glob.glob(text) if Path(p).is_file())
        if not shards:
            raise CorpusError(f"{text}: the glob matches no file; check the pattern")
        return shards
    p = Path(text)
    if p.is_file():
        return [p]
    if p.is_dir():
        shards = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
        if not shards:
            raise CorpusError(f"{p}: the directory holds no corpus file (.txt, .gz, .parquet)")
        return shards
    raise CorpusError(f"{p}: no such file or directory; give a text/.gz/Parquet file, a directory or a glob")


def _iter_text(path: Path, skip: int) -> Iterator[tuple[list[str], bool]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            for line in islice(f, skip, None):
                text, bad = decode_utf8(line)
                yield split_tokens(text), bad
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise CorpusError(f"{path}: cannot be read as {'gzip ' if opener is gzip.open else ''}text ({e})") from None


def parquet_column(path: Path, schema: pa.Schema, column: str | None) -> str:
    """The column holding the sentences: ``column`` if given, else the first of TOKEN_COLUMNS present."""
    names = schema.names
    if column is not None:
        if column not in names:
            raise CorpusError(f"{path}: no column {column!r}; the columns are {names}")
        return column
    for name in TOKEN_COLUMNS:
        if name in names:
            return name
    raise CorpusError(f"{path}: no text column; expected one of {list(TOKEN_COLUMNS)} "
                      f"(or pass --text-column), the columns are {names}")


def _cell(value: object, path: Path, row: int, column: str) -> tuple[list[str], bool]:
    if value is None:
        return [], False
    if isinstance(value, str):
        return split_tokens(value), False
    if isinstance(value, bytes):
        text, bad = decode_utf8(value)
        return split_tokens(text), bad
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t for t in value if t and not t.isspace()], False
    got = type(value).__name__
    if isinstance(value, list):
        k = next(i for i, t in enumerate(value) if not isinstance(t, str))
        got = f"a list whose item {k} is {'null' if value[k] is None else type(value[k]).__name__}"
    raise CorpusError(f"{path}: row {row}, column {column!r}: expected a string or a list of strings, got {got}")


def _iter_parquet(path: Path, skip: int, column: str | None) -> Iterator[tuple[list[str], bool]]:
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise CorpusError(f"{path}: not a readable Parquet file ({e})") from None
    col = parquet_column(path, pf.schema_arrow, column)
    start = 0  # the batch's first row
    batches = pf.iter_batches(batch_size=4096, columns=[col])
    while True:
        try:
            batch = next(batches, None)
        except (OSError, pa.ArrowInvalid) as e:  # a damaged page
            raise CorpusError(f"{path}: rows from {start:,} on cannot be read ({' '.join(str(e).split())}); the file "
                              f"is damaged: write it again") from None
        if batch is None:
            return
        first = max(skip - start, 0)  # the batch's rows before row ``skip``
        for row, value in enumerate(batch.column(0).slice(first).to_pylist(), start + first):
            yield _cell(value, path, row, col)
        start += batch.num_rows


def iter_records(path: Path, skip: int = 0, column: str | None = None) -> Iterator[tuple[list[str], bool]]:
    """Each record of one shard from record ``skip`` on: (tokens, had_invalid_utf8)."""
    if is_parquet(path):
        return _iter_parquet(path, skip, column)
    return _iter_text(path, skip)


def check_corpus(path: str | Path, column: str | None, flag: str) -> None:
    """A corpus flag's value (``--text``, ``--valid``) checked before a run reads it whole: its
    files found, ``column`` only where it holds Parquet files (else the flag is ignored), and at
    least one sentence (read up to the first). CorpusError naming the flag and the path."""
    try:
        shards = list_shards(path)
    except CorpusError as e:
        raise CorpusError(f"{flag} {e}") from None
    if column is not None and not any(is_parquet(s) for s in shards):
        raise CorpusError(f"{flag} {path}: --text-column {column!r} names a Parquet column, and this corpus holds no "
                          f"Parquet file; leave --text-column out")
    if next(iter_sentences(path, column), None) is None:
        raise CorpusError(f"{flag} {path}: the corpus holds no sentence (every line or row is empty)")


def iter_sentences(path: str | Path, column: str | None = None) -> Iterator[list[str]]:
    """Every non-empty sentence of a corpus once, streamed (vocabularies, evaluation, n-gram baselines)."""
    for shard in list_shards(path):
        yield from (tokens for tokens, _ in iter_records(shard, 0, column) if tokens)


def check_scoring(path: str | Path, batch_size: int = 32, max_sentences: int | None = None,
                  column: str | None = None, stateful: bool = False) -> None:
    """``training.perplexity.perplexity``'s settings and corpus, checked without the model or torch
    (the CLI asks first, before either loads)."""
    check_count("batch_size", batch_size)
    check_count("max_sentences", max_sentences, optional="all of them")
    if stateful and max_sentences is not None:
        raise SettingError("`max_sentences` does not apply to `stateful` scoring (each row reads a stream of the whole "
                           "corpus): leave one out")
    check_corpus(path, column, "--text")
