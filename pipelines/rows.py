"""From input rows (a text or a tokens column) to token lists; the model batches are
``inference.batching``'s."""
from __future__ import annotations

import pyarrow as pa

from corpora.files import decode_utf8
from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


def check_text_type(t: pa.DataType, tokens_column: bool, where: str) -> None:
    """A text column is a string; a tokens column a list of strings."""
    if tokens_column and not (_is_list(t) and _is_string(t.value_type)):
        raise InputError(f"{where}: --tokens-column must be list<string>, found {t}")
    if not tokens_column and not _is_string(t):
        raise InputError(f"{where}: --text-column must be a string column, found {t}"
                         + (" (use --tokens-column for list<string>)" if _is_list(t) else ""))


def decode_column(column: pa.Array | pa.ChunkedArray) -> tuple[list, int]:
    """The values as Python objects, and how many rows held invalid UTF-8. Invalid bytes are
    dropped, as the original reads its text (``errors="ignore"``); Arrow does not check strings it
    reads from Parquet, so a file may hold them."""
    try:
        return column.to_pylist(), 0
    except UnicodeDecodeError:
        pass
    t = column.type
    as_bytes = column.cast(pa.list_(pa.binary()) if _is_list(t) else pa.binary()).to_pylist()
    bad = 0

    def decode(b: bytes) -> str:
        nonlocal bad
        text, invalid = decode_utf8(b)
        bad += invalid
        return text
    values = [None if v is None else [None if b is None else decode(b) for b in v] if _is_list(t) else decode(v)
              for v in as_bytes]
    return values, bad


def row_values(column: pa.Array | pa.ChunkedArray, tokens_column: bool, name: str) -> tuple[list, int]:
    """The rows decoded: strings (a text column) or token lists (a list<string> column), None for
    null rows; and the number of strings with invalid UTF-8 (their bad bytes dropped)."""
    check_text_type(column.type, tokens_column, f"column '{name}'")
    rows, bad = decode_column(column)
    if tokens_column:
        for i, row in enumerate(rows):
            if row is not None and any(tok is None for tok in row):
                raise InputError(f"column '{name}', row {i} of the batch: a token is null "
                                 f"(tokens must be strings; drop or replace null tokens)")
    return rows, bad


def row_tokens(column: pa.Array | pa.ChunkedArray, tokens_column: bool, name: str) -> tuple[list[list[str] | None], int]:
    """Token lists of a text column (whitespace split) or a list<string> column, None for null rows;
    and the number of strings with invalid UTF-8 (their bad bytes dropped)."""
    rows, bad = row_values(column, tokens_column, name)
    return (rows if tokens_column else [None if s is None else split_tokens(s) for s in rows]), bad
