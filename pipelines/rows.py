"""From input rows to token lists, windows of long rows, and length-bucketed model batches.

Windowing (rows longer than ``max_sentence_length`` = M tokens): overlapping windows with
``context`` = c tokens of context on each side. Window k covers at most M tokens; each token's
vector is taken from the one window where it has at least c tokens of context on both sides
(fewer only at the row's own start and end). The windows are embedded as independent sentences
(each gets its own <S> and </S>) and the kept parts are joined back, so a row of n tokens still
gives exactly n vectors. With c = 0 the windows are plain non-overlapping chunks of M tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens


@dataclass(frozen=True)
class Span:
    """One window of a row: tokens [start, end) go to the model, [keep_from, keep_to) are kept."""

    start: int
    end: int
    keep_from: int
    keep_to: int


def window_spans(n: int, max_len: int, context: int) -> list[Span]:
    """The windows of a row of ``n`` tokens (one window when n <= max_len). See the module doc."""
    if n <= max_len:
        return [Span(0, n, 0, n)]
    spans, keep_from = [], 0
    while True:
        start = max(0, keep_from - context)
        if start + max_len >= n:  # last window: a full one ending at the row's end
            spans.append(Span(max(0, n - max_len), n, keep_from, n))
            return spans
        keep_to = start + max_len - context
        spans.append(Span(start, start + max_len, keep_from, keep_to))
        keep_from = keep_to


def window_counts(lengths: np.ndarray, max_len: int, context: int) -> tuple[int, int]:
    """(windows, rows cut into windows) for rows of these token counts (-1 or 0: none)."""
    long = lengths[lengths > max_len]
    return sum(len(window_spans(int(n), max_len, context)) for n in long), int(long.size)


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


def _to_pylist(column: pa.Array | pa.ChunkedArray) -> tuple[list, int]:
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
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
            return b.decode("utf-8", errors="ignore")
    values = [None if v is None else [None if b is None else decode(b) for b in v] if _is_list(t) else decode(v)
              for v in as_bytes]
    return values, bad


def row_tokens(column: pa.Array | pa.ChunkedArray, tokens_column: bool, name: str) -> tuple[list[list[str] | None], int]:
    """Token lists of a text column (whitespace split) or a list<string> column, None for null rows;
    and the number of strings with invalid UTF-8 (their bad bytes dropped)."""
    check_text_type(column.type, tokens_column, f"column '{name}'")
    rows, bad = _to_pylist(column)
    if not tokens_column:
        return [None if s is None else split_tokens(s) for s in rows], bad
    for i, row in enumerate(rows):
        if row is not None and any(tok is None for tok in row):
            raise InputError(f"column '{name}', row {i} of the batch: a token is null "
                             f"(tokens must be strings; drop or replace null tokens)")
    return rows, bad


@dataclass
class ModelBatch:
    """One backend call. ``pieces[k]`` = (dest, skip, n): row k's tokens [skip, skip+n) go to out[dest:dest+n]."""

    tokens: list[Sequence[str]]
    pieces: list[tuple[int, int, int]]

    def gather_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(batch row, position, output row) of every token this batch places.

        Shape: -> three (n,) int64 arrays, n = the tokens kept from this batch.
        """
        dest0, skip, n = (np.array(v, dtype=np.int64) for v in zip(*self.pieces))  # (K,) each
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # (n,) position within its piece
        return np.repeat(np.arange(len(n)), n), np.repeat(skip, n) + within, np.repeat(dest0, n) + within


@dataclass
class Plan:
    """How a batch of rows is cut into windows and model batches."""

    lengths: np.ndarray  # (R,) tokens per row, -1 for a null row
    batches: list[ModelBatch]
    windows: int  # model inputs that are windows of long rows
    windowed_rows: int

    @property
    def tokens(self) -> int:
        return int(np.maximum(self.lengths, 0).sum())


def plan_batches(rows: list[list[str] | None], max_len: int, context: int, max_tokens: int) -> Plan:
    """Split long rows into windows, sort every piece by length and pack batches under ``max_tokens``.

    A batch's cost is its number of rows times its longest row (the padded size the model runs).
    """
    lengths = np.array([-1 if r is None else len(r) for r in rows], dtype=np.int64)  # (R,)
    dest0 = np.concatenate([[0], np.cumsum(np.maximum(lengths, 0))])[:-1]  # (R,) first token's output row
    pieces: list[tuple[Sequence[str], int, int, int]] = []  # (tokens, dest, skip, n)
    windows = windowed = 0
    for r, row in enumerate(rows):
        if not row:
            continue
        spans = window_spans(len(row), max_len, context)
        if len(spans) > 1:
            windows, windowed = windows + len(spans), windowed + 1
        for s in spans:
            pieces.append((row[s.start:s.end], int(dest0[r]) + s.keep_from, s.keep_from - s.start, s.keep_to - s.keep_from))
    pieces.sort(key=lambda p: -len(p[0]))  # stable: equal lengths stay in input order
    batches: list[ModelBatch] = []
    for tokens, dest, skip, n in pieces:
        cur = batches[-1] if batches else None
        if cur is None or (len(cur.tokens) + 1) * len(cur.tokens[0]) > max_tokens:
            cur = ModelBatch([], [])
            batches.append(cur)
        cur.tokens.append(tokens)
        cur.pieces.append((dest, skip, n))
    return Plan(lengths, batches, windows, windowed)
