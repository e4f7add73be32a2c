"""Reading the inputs that are not Parquet, as record batches: CSV and TSV (``pyarrow.csv``: a
header row names the columns; TSV fields are not quoted), JSON Lines (``pyarrow.json``: one object
per line, its keys the columns) and text (one sentence per line, the line without its line break
as the text column ``--text-column``; an empty line is an empty row).

Each is read as a stream, in file order, one row per CSV record, JSON line or text line, so a shard
(``pipelines.source``) is the same rows whichever process reads it. A file that cannot be read
whole is an InputError naming the file, the line and what is wrong (a CSV record with the wrong
number of fields, a line that is not a JSON object, a value of another type than its column's,
bytes that are not UTF-8), found when the job scans its inputs, before anything is written.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from elmo_core.errors import InputError
from storage.locations import file_info, open_input

BLOCK_BYTES = 1 << 22


def batches(path: Path | str, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's rows as record batches of at most ``batch_rows`` rows, in file order."""
    with open_input(path) as f:
        reader = {"csv": _csv, "tsv": _csv, "jsonl": _jsonl, "text": _text}[fmt]
        for batch in reader(f, path, fmt, text_column, batch_rows):
            for start in range(0, batch.num_rows, batch_rows):
                yield batch.slice(start, batch_rows)


def schema_and_rows(path: Path | str, fmt: str, text_column: str) -> tuple[pa.Schema, int]:
    """The file's schema and row count, every row read (and so checked)."""
    rows, schema = 0, None
    for batch in batches(path, fmt, text_column, 1 << 16):
        rows, schema = rows + batch.num_rows, schema or batch.schema
    if fmt == "jsonl" and not _one_object_a_line(path, rows):
        raise InputError(f"{path}: {_bad_json_line(path) or f'{rows:,} rows read from fewer lines'}; every line "
                         f"holds one JSON object whose keys are the columns (a row a line)")
    # no rows: the schema the reader saw (a CSV header), else the text column's
    return (schema if schema is not None else _empty_schema(path, fmt, text_column)), rows


def read_table(path: Path | str, fmt: str, text_column: str, columns: list[str]) -> pa.Table:
    schema, _ = schema_and_rows(path, fmt, text_column)
    return pa.Table.from_batches(list(batches(path, fmt, text_column, 1 << 16)), schema=schema).select(columns)


def _empty_schema(path: Path | str, fmt: str, text_column: str) -> pa.Schema:
    if fmt in ("csv", "tsv"):
        with open_input(path) as f:
            try:
                return _csv_reader(f, fmt, text_column, []).schema
            except pa.ArrowInvalid:  # an empty file: not even a header
                pass
    return pa.schema([pa.field(text_column, pa.string())])


def _csv_reader(f, fmt: str, text_column: str, bad: list, strings: tuple[str, ...] = (),
                blank_rows: bool = False) -> pa_csv.CSVStreamingReader:
    """pyarrow's streaming reader of a CSV/TSV file; ``blank_rows``: a blank line is a row (an empty
    value: a one-column file's, ``_one_column``), else skipped, as every CSV reader does."""
    def invalid(row: pa_csv.InvalidRow) -> str:
        bad.append(row)
        return "skip"

    parse = pa_csv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", quote_char=False if fmt == "tsv" else '"',
                                invalid_row_handler=invalid, ignore_empty_lines=not blank_rows)
    return pa_csv.open_csv(f, read_options=pa_csv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
                           parse_options=parse, convert_options=pa_csv.ConvertOptions(
                               column_types={c: pa.string() for c in (text_column, *strings)},
                               strings_can_be_null=False))


def _head(path: Path | str) -> str:
    """A CSV/TSV file's first 64 KiB as text (its header record, of 64 KiB at most)."""
    with open_input(path) as f:
        return f.read(1 << 16).decode("utf-8-sig", errors="replace")


def _blank(path: Path | str) -> bool:
    """Whether the file holds nothing but whitespace (and a byte-order mark), read until it does not."""
    with open_input(path) as f:
        first = True
        while data := f.read(1 << 20):
            if (data.removeprefix(b"\xef\xbb\xbf") if first else data).strip():
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


_CONVERSION = re.compile(r"In CSV column #(\d+): Row #\d+: CSV conversion error")


@functools.lru_cache(maxsize=256)
def _string_columns(path: Path | str, fmt: str, text_column: str, size_and_mtime: object) -> tuple[str, ...]:
    """The columns of a CSV/TSV file read as strings: those whose type, inferred from the file's first
    block (4 MiB), a later block does not fit (a column empty at first, then text; ints, then
    floats). Found by reading the file (once per version of it in a process: ``size_and_mtime``),
    each conflict making its column a string one, so every process reads the same types."""
    strings: tuple[str, ...] = ()
    names: list[str] = []
    while True:
        with open_input(path) as f:
            try:
                reader = _csv_reader(f, fmt, text_column, [], strings, _one_column(path, fmt))
                names = reader.schema.names
                for _ in reader:
                    pass
                return strings
            except pa.ArrowInvalid as e:
                found = _CONVERSION.search(str(e))
                if found is None or not 0 <= int(found.group(1)) < len(names) or names[int(found.group(1))] in strings:
                    return strings  # another problem: the reading names it
                strings += (names[int(found.group(1))],)


def _csv(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    bad: list[pa_csv.InvalidRow] = []
    rows, last = 0, None
    try:
        info = file_info(path)  # a file of one block has its types from every row already
        strings = _string_columns(path, fmt, text_column, info) if info and info[0] > BLOCK_BYTES else ()
        reader = _csv_reader(f, fmt, text_column, bad, strings, _one_column(path, fmt))
        for batch in reader:
            if bad:
                break
            rows, last = rows + batch.num_rows, batch
            yield batch
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e) and _blank(path):
            return
        if "Empty CSV file" in str(e):  # pyarrow's words where no record ends: a quote never closed
            raise InputError(f"{path}: no record of it ends: a quote opens in its header and never closes; close the "
                             f"quote (a quote inside a quoted name is written twice, \"\")") from None
        raise InputError(f"{path}: not readable as {fmt.upper()} ({e}); fix the file or convert it to Parquet") from None
    if not bad and fmt == "csv":
        _check_closed(path, last, rows)
    if bad:
        row = bad[0]
        raise InputError(f"{path}: record {row.number} (the header is record 1): {row.actual_columns} fields where "
                         f"the header has {row.expected_columns} ({row.text[:80]!r}); " +
                         ("a TSV field cannot hold a tab (TSV fields are not quoted): remove it, or write the file as "
                          "CSV" if fmt == "tsv" else "quote a field that holds the delimiter"))


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


def _json_reader(f, schema: pa.Schema | None) -> pa_json.JSONStreamingReader:  # type: ignore[name-defined]
    parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer") if schema is not None \
        else pa_json.ParseOptions()
    return pa_json.open_json(f, read_options=pa_json.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
                             parse_options=parse)


@functools.lru_cache(maxsize=256)
def _json_schema(path: Path | str, size_and_mtime: object) -> pa.Schema | None:
    """The types a JSON Lines file of several blocks is read with, where its first block (4 MiB) does
    not tell them (a key first null, then a string; a key that appears late; ints, then floats):
    each key's type from every line (null, int64, double, bool or string; a nested key is left to
    the reader). None where the file reads as it is, or where no type fits a key (the reading
    names its line). Once per version of the file in a process (``size_and_mtime``)."""
    with open_input(path) as f:
        try:
            for _ in _json_reader(f, None):
                pass
            return None
        except pa.ArrowInvalid:
            pass
    kinds: dict[str, set[type]] = {}
    with open_input(path) as f:
        for line in raw_lines(f):
            try:
                value = json.loads(line) if line.strip() else {}
            except ValueError:
                return None
            if not isinstance(value, dict):
                return None
            for key, v in value.items():
                kinds.setdefault(key, set()).add(type(v))
    fields = []
    for key, found in kinds.items():
        types = found - {type(None)}
        if types & {list, dict}:
            continue  # nested: the reader's own inference
        arrow = pa.null() if not types else pa.int64() if types == {int} else pa.float64() if types <= {int, float} \
            else pa.bool_() if types == {bool} else pa.string() if types == {str} else None
        if arrow is None:
            return None
        fields.append(pa.field(key, arrow))
    return pa.schema(fields)


def _jsonl(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        info = file_info(path)  # a file of one block has its types from every line already
        reader = _json_reader(f, _json_schema(path, info) if info and info[0] > BLOCK_BYTES else None)
        yield from reader
    except pa.ArrowInvalid as e:
        if "Empty JSON file" in str(e) or "Empty JSON stream" in str(e):  # pyarrow's words, by version
            return
        raise InputError(f"{path}: {_bad_json_line(path) or f'not JSON Lines ({e})'}; every line holds one "
                         f"JSON object whose keys are the columns, each key's values of one type") from None


def _bad_json_line(path: Path | str) -> str:
    """The first line that is not a JSON object, or whose value changes a key's type, in words."""
    types: dict[str, str] = {}
    with open_input(path) as f:
        for n, line in enumerate(raw_lines(f), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line, object_pairs_hook=_unique_keys)
            except _DuplicateKey as e:
                return f"line {n}: {e}"
            except ValueError as e:
                return f"line {n} is not JSON ({e})"
            if not isinstance(value, dict):
                return f"line {n} is a JSON {_json_kind(value)}, not an object"
            if _lone_surrogate(line, value):
                return f"line {n} holds a lone surrogate (\\ud800-\\udfff, in a key or a value), which is no character"
            for key, v in value.items():
                kind = _json_kind(v)
                if kind != "null" and types.setdefault(key, kind) != kind:
                    return f"line {n}: column '{key}' holds a {kind} where earlier lines hold a {types[key]}"
    return ""


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; _DuplicateKey for a key given twice (pyarrow refuses it)."""
    value = dict(pairs)
    if len(value) < len(pairs):
        key = next(k for i, (k, _) in enumerate(pairs) if k in (p for p, _ in pairs[:i]))
        raise _DuplicateKey(f"key '{key}' appears twice in one object")
    return value


def _lone_surrogate(line: bytes, value: object) -> bool:
    """Whether the parsed ``value`` of ``line`` holds a lone surrogate anywhere (only an escape
    ``\\uD8..`` can write one)."""
    if b"\\u" not in line:
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _one_object_a_line(path: Path | str, rows: int) -> bool:
    """Whether ``rows`` (what pyarrow read: two objects on one line are two rows to it) is the count
    of the file's lines that hold something (a blank line is no row), each beginning as an object
    does (pyarrow reads a line ``null`` as a row of nulls), counted by a regex a chunk at a time."""
    count, rest, objects, first = 0, b"", True, True
    with open_input(path) as f:
        while data := f.read(1 << 20):
            buf = (rest + data).removeprefix(b"\xef\xbb\xbf" if first else b"")  # the file's byte-order mark
            first = False
            cut = buf.rfind(b"\n") + 1  # whole lines only; the rest waits for the next chunk
            count, rest = count + len(_NON_BLANK_LINE.findall(buf, 0, cut)), buf[cut:]
            objects = objects and _NOT_AN_OBJECT.search(buf, 0, cut) is None
    return objects and not _NOT_AN_OBJECT.search(rest) and count + bool(rest.strip()) == rows


_NON_BLANK_LINE = re.compile(rb"[^\s][^\n]*")  # a line's first non-space byte to its end: once a line that holds any
_NOT_AN_OBJECT = re.compile(rb"^[ \t\r\f\v]*[^\s{]", re.MULTILINE)  # a line whose first non-space byte is no {


def _json_kind(v) -> str:
    return ("null" if v is None else "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float))
            else "string" if isinstance(v, str) else type(v).__name__)


def raw_lines(f, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A binary file's lines, each with its \\n (the last one may lack it), read a chunk at a time: a
    store's file (pyarrow's NativeFile) reads but does not iterate by lines."""
    rest = b""
    while data := f.read(chunk):
        *lines, rest = (rest + data).split(b"\n")
        yield from (line + b"\n" for line in lines)
    if rest:
        yield rest


def text_lines(raw_lines: Iterator[bytes], path: Path | str) -> Iterator[str]:
    """A text file's lines, as Python's text mode reads them (the one rule of both text doors: a line
    ends at \\n, \\r\\n or \\r, its break not kept), from its raw lines (split at \\n); a byte-order mark
    at the start is not text. InputError naming the line that is not UTF-8."""
    n = 0
    for k, raw in enumerate(raw_lines):
        try:
            text = raw.decode("utf-8-sig" if k == 0 else "utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: line {n + 1} is not UTF-8 ({e}); a text INPUT holds one UTF-8 sentence per "
                             f"line") from None
        pieces = re.sub(r"\r?\n\Z", "", text).split("\r")  # an old Mac file's lines end at a lone CR
        if text.endswith("\r"):
            pieces.pop()  # a CR that ends the file's last line: no line after it
        for piece in pieces:
            n += 1
            yield piece


def _text(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    lines: list[str] = []
    for line in text_lines(raw_lines(f), path):
        lines.append(line)
        if len(lines) == batch_rows:
            yield pa.record_batch([pa.array(lines, pa.string())], names=[text_column])
            lines = []
    if lines:
        yield pa.record_batch([pa.array(lines, pa.string())], names=[text_column])
