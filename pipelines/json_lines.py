"""JSON Lines (``.jsonl``, ``.ndjson``) read by ``pyarrow.json``: one object per line, its keys the
columns, each key of JSON's types (int64, double, bool, string, lists, objects). What pyarrow lets
by is refused, naming the line: a line that is not one object, bytes that are not UTF-8, an integer
it would round (one no int64 holds, or one past 2**53 in a key that also holds floats: a double)."""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.json as pa_json

from elmo_core.errors import InputError
from storage.locations import file_info, open_input

from . import input_bytes
from .input_bytes import decoded, line_chunks, raw_lines


def _json_reader(f, schema: pa.Schema | None) -> pa_json.JSONStreamingReader:  # type: ignore[name-defined]
    parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer") if schema is not None \
        else pa_json.ParseOptions()
    read = pa_json.ReadOptions(use_threads=False, block_size=input_bytes.BLOCK_BYTES)
    return pa_json.open_json(f, read_options=read, parse_options=parse)


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


def read(f, path, fmt: str, text_column: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        info = file_info(path)  # a file of one block has its types from every line already
        reader = _json_reader(f, _json_schema(path, info) if info and info[0] > input_bytes.BLOCK_BYTES else None)
        yield from reader
    except pa.ArrowInvalid as e:
        if "Empty JSON file" in str(e) or "Empty JSON stream" in str(e):  # pyarrow's words, by version
            return
        raise InputError(f"{path}: {_bad_json_line(path) or f'not JSON Lines ({e})'}; every line holds one "
                         f"JSON object whose keys are the columns, each key's values of one type") from None


def _bad_json_line(path: Path | str) -> str:
    """The first line that is not a JSON object, or whose value changes a key's type, in words;
    InputError for a line that is not UTF-8, else for the first integer no int64 holds (pyarrow
    refuses such a file where it reads it with the types of every line), in any key."""
    rounded: list[InputError] = []
    found = _first_bad_line(path, rounded)
    if not found and rounded:
        raise rounded[0]
    return found


def _first_bad_line(path: Path | str, rounded: list[InputError]) -> str:
    """``_bad_json_line``'s line in words, the integers no int64 holds added to ``rounded``."""
    types: dict[str, str] = {}
    with open_input(path) as f:
        for n, line in enumerate(raw_lines(f), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(decoded(line, path, n, "utf-8-sig" if n == 1 else "utf-8"),
                                   object_pairs_hook=_unique_keys)
            except _DuplicateKey as e:
                return f"line {n}: {e}"
            except ValueError as e:
                return f"line {n} is not JSON ({e})"
            if not isinstance(value, dict):
                return f"line {n} is a JSON {_json_kind(value)}, not an object"
            if _lone_surrogate(line, value):
                return f"line {n} holds a lone surrogate (\\ud800-\\udfff, in a key or a value), which is no character"
            try:
                _check_numbers(path, n, value, None)
            except InputError as e:
                rounded.append(e)
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


def check(path: Path | str, rows: int, schema: pa.Schema | None, kept: tuple[str, ...] = ()) -> None:
    """InputError naming the line of what pyarrow let by in a JSON Lines file it read as
    ``rows`` rows of ``schema``: bytes that are not UTF-8 (kept in its strings), an integer it
    rounded in a key the job keeps (``kept``; ``_inexact``: only a key read as doubles, nested too,
    can hold one), a line that is not one object (two objects on a line are two rows to it, a line
    ``null`` a row of nulls): ``rows`` is then not the count of the lines that hold something (a
    blank line is no row), each beginning as an object does. A chunk at a time."""
    count, objects = 0, True
    doubles = _with_doubles(schema, kept)
    for chunk, first in line_chunks(path):
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            start, end = chunk.rfind(b"\n", 0, e.start) + 1, chunk.find(b"\n", e.start)
            decoded(chunk[start:end if end >= 0 else None], path, first + chunk.count(b"\n", 0, start))
        if doubles and _LONG_DIGITS.search(chunk):  # an integer past 2**53 may be in it (a double holds every one below)
            for n, line in enumerate(chunk.split(b"\n"), first):
                if _LONG_DIGITS.search(line) and isinstance(value := _loads(line), dict):
                    _check_numbers(path, n, {k: v for k, v in value.items() if k in doubles}, schema)
        count += len(_NON_BLANK_LINE.findall(chunk))
        objects = objects and _NOT_AN_OBJECT.search(chunk) is None
    if not objects or count != rows:
        raise InputError(f"{path}: {_bad_json_line(path) or f'{rows:,} rows read from fewer lines'}; every line "
                         f"holds one JSON object whose keys are the columns (a row a line)")


def _with_doubles(schema: pa.Schema | None, kept: tuple[str, ...]) -> set[str]:
    """The keys of ``kept`` that ``schema`` types with a double somewhere (nested too): where pyarrow
    puts an integer no int64 holds, and where a double rounds one past 2**53."""
    def has_double(t: pa.DataType) -> bool:
        return pa.types.is_floating(t) or any(has_double(t.field(i).type) for i in range(t.num_fields))

    found = set()
    for i in range(len(schema) if schema is not None else 0):
        field = schema.field(i)
        try:
            name = field.name
        except UnicodeDecodeError:  # a key that is not UTF-8: no kept column's (``check`` names its line)
            continue
        if name in kept and has_double(field.type):
            found.add(name)
    return found


_NON_BLANK_LINE = re.compile(rb"[^\s][^\n]*")  # a line's first non-space byte to its end: once a line that holds any
_NOT_AN_OBJECT = re.compile(rb"^[ \t\r\f\v]*[^\s{]", re.MULTILINE)  # a line whose first non-space byte is no {
_LONG_DIGITS = re.compile(rb"\d{16}")  # 2**53 + 1, the least integer a double rounds, has 16 digits
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _loads(line: bytes) -> object:
    """A line's JSON value; None where it is none (the reading names the line)."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def _check_numbers(path: Path | str, n: int, value: dict, schema: pa.Schema | None) -> None:
    """InputError for a key of line ``n``'s object that holds an integer pyarrow would not read
    exactly as ``schema`` (None: not known yet) types the key (``_inexact``)."""
    for key, v in value.items():
        index = schema.get_field_index(key) if schema is not None else -1
        number = _inexact(v, schema.field(index).type if index >= 0 else None)
        if number is not None:
            why = ("beyond a 64-bit integer, which pyarrow reads as a double" if not _INT64[0] <= number <= _INT64[1]
                   else "in a key that holds numbers with a fraction too: a column of doubles")
            raise InputError(f"{path}: line {n}: key '{key}' holds the integer {number}, {why}, whose 53 bits "
                             f"round it; write it as a JSON string (\"{number}\") to keep every digit")


def _inexact(value: object, arrow_type: pa.DataType | None) -> int | None:
    """The first integer in a JSON ``value`` (a key's, nested too) that pyarrow would not read
    exactly: one no int64 holds (pyarrow reads it as a double), or one a double rounds where
    ``arrow_type`` (None: unknown) is a double (a key of integers and floats); else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        double = arrow_type is not None and pa.types.is_floating(arrow_type)
        return value if not _INT64[0] <= value <= _INT64[1] or (double and float(value) != value) else None
    if isinstance(value, list):
        item = arrow_type.value_type if arrow_type is not None and pa.types.is_list(arrow_type) else None
        return next((found for v in value if (found := _inexact(v, item)) is not None), None)
    if isinstance(value, dict):
        struct = arrow_type is not None and pa.types.is_struct(arrow_type)
        fields = {f.name: f.type for f in arrow_type} if struct else {}
        return next((found for k, v in value.items() if (found := _inexact(v, fields.get(k))) is not None), None)
    return None


def _json_kind(v) -> str:
    return ("null" if v is None else "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float))
            else "string" if isinstance(v, str) else type(v).__name__)
