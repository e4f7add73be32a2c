"""Reading the inputs that are not Parquet, as record batches: CSV and TSV (``pyarrow.csv``: a
header row names the columns; TSV fields are not quoted), JSON Lines (``pyarrow.json``: one object
per line, its keys the columns) and text (one sentence per line, the line without its line break
as the text column ``--text-column``; an empty line is an empty row).

A CSV/TSV column is the text it holds, every one a string (as Spark's CSV reader without
inferSchema): ``007`` stays "007", an empty field is "" (never null), whatever its other rows or
files hold. A JSON Lines key keeps JSON's types (``pipelines.json_lines``).

Each is read as a stream, in file order, one row per CSV record, JSON line or text line, so a shard
(``pipelines.source``) is the same rows whichever process reads it. A file that cannot be read
whole is an InputError naming the file, the line and what is wrong (a CSV record with the wrong
number of fields, a line that is not a JSON object, a value of another type than its column's, an
integer a JSON Lines column would round, bytes that are not UTF-8: ``not_utf8``, one message for
every format), found when the job scans its inputs, before anything is written.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv

from elmo_core.errors import InputError
from storage.locations import open_input

from . import input_bytes, json_lines
from .input_bytes import BOM, not_utf8, raw_lines, text_lines


def batches(path: Path | str, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's rows as record batches of at most ``batch_rows`` rows, in file order."""
    with open_input(path) as f:
        reader = {"csv": _csv, "tsv": _csv, "jsonl": json_lines.read, "text": _text}[fmt]
        for batch in reader(f, path, fmt, text_column, batch_rows):
            for start in range(0, batch.num_rows, batch_rows):
                yield batch.slice(start, batch_rows)


def schema_and_rows(path: Path | str, fmt: str, text_column: str,
                    kept: tuple[str, ...] = ()) -> tuple[pa.Schema, int]:
    """The file's schema and row count, every row read (and so checked; ``kept``: the columns a job
    copies, whose values must be read exactly)."""
    rows, schema = 0, None
    for batch in batches(path, fmt, text_column, 1 << 16):
        rows, schema = rows + batch.num_rows, schema or batch.schema
    if fmt == "jsonl":
        json_lines.check(path, rows, schema, kept)
    # no rows: the schema the reader saw (a CSV header), else the text column's
    return (schema if schema is not None else _empty_schema(path, fmt, text_column)), rows


def read_table(path: Path | str, fmt: str, text_column: str, columns: list[str]) -> pa.Table:
    schema, _ = schema_and_rows(path, fmt, text_column, tuple(columns))
    return pa.Table.from_batches(list(batches(path, fmt, text_column, 1 << 16)), schema=schema).select(columns)


def _empty_schema(path: Path | str, fmt: str, text_column: str) -> pa.Schema:
    if fmt in ("csv", "tsv"):
        with open_input(path) as f:
            try:
                return pa.schema([pa.field(name, pa.string()) for name in _csv_names(f, fmt)])
            except pa.ArrowInvalid:  # an empty file: not even a header
                pass
    return pa.schema([pa.field(text_column, pa.string())])


def _csv_parse(fmt: str, bad: list, blank_rows: bool) -> pa_csv.ParseOptions:
    """How pyarrow parses a CSV/TSV file; a record of the wrong number of fields is skipped and
    added to ``bad``; ``blank_rows``: a blank line is a row (an empty value: a one-column file's,
    ``_one_column``), else skipped, as every CSV reader does."""
    def invalid(row: pa_csv.InvalidRow) -> str:
        bad.append(row)
        return "skip"

    return pa_csv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", quote_char=False if fmt == "tsv" else '"',
                               invalid_row_handler=invalid, ignore_empty_lines=not blank_rows)


def _csv_names(f, fmt: str) -> list[str]:
    """The columns the file's header names, as pyarrow reads them, from the file's first block (its
    lines that end in it; the whole file as pyarrow opens it where they do not parse: pyarrow reads
    several blocks ahead of a file), the file then read again from its start."""
    read = pa_csv.ReadOptions(use_threads=False, block_size=input_bytes.BLOCK_BYTES)
    head = f.read(input_bytes.BLOCK_BYTES)
    f.seek(0)
    try:
        lines = pa.BufferReader(head[: head.rfind(b"\n") + 1] or head)
        return pa_csv.open_csv(lines, read_options=read, parse_options=_csv_parse(fmt, [], False)).schema.names
    except pa.ArrowInvalid:
        pass
    names = pa_csv.open_csv(f, read_options=read, parse_options=_csv_parse(fmt, [], False)).schema.names
    f.seek(0)
    return names


def _csv_reader(f, fmt: str, names: list[str], bad: list, blank_rows: bool = False) -> pa_csv.CSVStreamingReader:
    """pyarrow's streaming reader of a CSV/TSV file whose header names ``names``, every column a
    string holding the characters of its field, an empty field "" (pyarrow infers no type)."""
    return pa_csv.open_csv(f, read_options=pa_csv.ReadOptions(use_threads=False, block_size=input_bytes.BLOCK_BYTES),
                           parse_options=_csv_parse(fmt, bad, blank_rows), convert_options=pa_csv.ConvertOptions(
                               column_types={name: pa.string() for name in names}, strings_can_be_null=False))


def _head(path: Path | str) -> str:
    """A CSV/TSV file's first 64 KiB as text (its header record, of 64 KiB at most)."""
    with open_input(path) as f:
        return f.read(1 << 16).decode("utf-8-sig", errors="replace")


def _blank(path: Path | str) -> bool:
    """Whether the file holds nothing but whitespace (and a byte-order mark), read until it does not."""
    with open_input(path) as f:
        first = True
        while data := f.read(1 << 20):
            if (data.removeprefix(BOM) if first else data).strip():
                return False
            first = False
    return True


def _one_column(path: Path | str, fmt: str) -> bool:
    """Whether a CSV/TSV file's header names one column: its blank lines are then empty rows (as a
    text file's), which pyarrow would skip; in a file of several columns a blank line is no row. The
    header ends at \\n, \\r\\n or a lone \\r, as pyarrow's records do, and a CSV header's quoted name
    may hold a line break."""
    head = _head(path)
    if fmt == "tsv":
        return "\t" not in re.split(r"\r\n|\r|\n", head, maxsplit=1)[0]
    return len(next(csv.reader(io.StringIO(head, newline="")), [""])) == 1


_NOT_UTF8 = re.compile(r"In CSV column #(\d+): Row #(\d+): CSV conversion error to string: invalid UTF8")


def _csv(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    bad: list[pa_csv.InvalidRow] = []
    rows, last, names = 0, None, []
    try:
        names = _csv_names(f, fmt)
        for batch in _csv_reader(f, fmt, names, bad, _one_column(path, fmt)):
            if bad:
                break
            rows, last = rows + batch.num_rows, batch
            yield batch
    except UnicodeDecodeError as e:  # pyarrow decodes the header's names with Python's codec
        raise not_utf8(path, "record 1 (the header), a column name", e) from None
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e) and _blank(path):
            return
        raise _csv_error(path, fmt, names, e) from None
    if not bad and fmt == "csv":
        _check_closed(path, last, rows)
    if bad:
        row = bad[0]
        raise InputError(f"{path}: record {row.number} (the header is record 1): {row.actual_columns} fields where "
                         f"the header has {row.expected_columns} ({row.text[:80]!r}); " +
                         ("a TSV field cannot hold a tab (TSV fields are not quoted): remove it, or write the file as "
                          "CSV" if fmt == "tsv" else "quote a field that holds the delimiter"))


def _csv_error(path: Path | str, fmt: str, names: list[str], e: pa.ArrowInvalid) -> InputError:
    """What pyarrow's error reading a CSV/TSV file (not a blank one) means, in words."""
    if "Empty CSV file" in str(e):  # pyarrow's words where no record ends: a quote never closed
        return InputError(f"{path}: no record of it ends: a quote opens in its header and never closes; close the "
                          f"quote (a quote inside a quoted name is written twice, \"\")")
    if (found := _NOT_UTF8.search(str(e))) and (column := int(found.group(1))) < len(names):
        return not_utf8(path, f"record {found.group(2)} (the header is record 1), column '{names[column]}'")
    return InputError(f"{path}: not readable as {fmt.upper()} ({e}); fix the file or convert it to Parquet")


def _check_closed(path: Path | str, batch: pa.RecordBatch | None, rows: int) -> None:
    """A quote the file opens and never closes runs its field to the end of the file: the last row's
    last field then ends with the file's last line break (a field can hold one only where quoted),
    which a closed quote around it would have ended before."""
    if batch is None or batch.num_rows == 0:
        return
    value = batch.column(batch.num_columns - 1)[batch.num_rows - 1].as_py()
    if isinstance(value, str) and value.endswith(("\n", "\r")) and not _ends_quoted(path):
        first = value.count("\n") + value.count("\r") - value.count("\r\n")
        raise InputError(f"{path}: row {rows}: a quote opens its last field and never closes, so the field runs to the "
                         f"end of the file ({first} line breaks); close the quote (a quote inside a quoted field is "
                         f"written twice, \"\")")


def _ends_quoted(path: Path | str) -> bool:
    """Whether the file's last field is closed by a quote: its last character before the final line
    breaks is a quote that is not half of an escaped pair (an odd run of quotes). A quoted field may
    end with a line break of its own ("ends\n"), so the field's value alone cannot tell."""
    with open_input(path) as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - 4096))
        tail = f.read().rstrip(b"\r\n")
    run = len(tail) - len(tail.rstrip(b'"'))
    return run % 2 == 1


def _text(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    lines: list[str] = []
    for line in text_lines(raw_lines(f), path):
        lines.append(line)
        if len(lines) == batch_rows:
            yield pa.record_batch([pa.array(lines, pa.string())], names=[text_column])
            lines = []
    if lines:
        yield pa.record_batch([pa.array(lines, pa.string())], names=[text_column])
