"""The input side: resolving INPUT to its files (Parquet, CSV, TSV, JSON Lines or text:
``corpora.files.input_files``; the others read by ``pipelines.input_formats``), checking them before
anything is written, and streaming each shard's rows as windows of record batches with column projection.

Shards: input file i (in sorted path order) is cut into shards of ``rows_per_shard`` rows;
shard (i, k) holds rows [k * rows_per_shard, (k + 1) * rows_per_shard) of file i and is written
as ``part-{i:05d}-{k:05d}.parquet``. Sorting the output names therefore gives the input order.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpora.files import input_files
from elmo_core.errors import InputError
from storage.locations import dataset_source, file_etag, file_info, file_sha256, is_uri, open_input
from elmo_core.whitespace import TOKEN_PATTERN

from . import input_formats
from .options import EmbedOptions
from .progress import note
from .rows import check_text_type
from .schema import ELMO_COLUMN

if TYPE_CHECKING:
    import pyarrow.dataset as ds


@dataclass(frozen=True)
class InputFile:
    """An input file as the job first saw it; ``identity`` changes when the file is edited."""

    index: int
    path: Path | str  # a local path, or a URI (storage.locations)
    rows: int
    size: int
    mtime_ns: int
    footer_sha256: str  # input_sha256: a Parquet file's footer (schema, row groups, offsets, statistics), else all of it
    schema: pa.Schema
    etag: str | None = None  # on S3, the object's version (any rewrite changes it); not in the identity
    format: str = "parquet"  # corpora.files.INPUT_FORMATS
    expected_tokens: int = 0  # about how many it holds, from its footer or size (``parquet_tokens``, ``file_tokens``)

    def identity(self) -> dict:
        identity = {"path": str(self.path), "rows": self.rows, "bytes": self.size, "mtime_ns": self.mtime_ns,
                    "footer_sha256": self.footer_sha256}
        return identity if self.format == "parquet" else {**identity, "format": self.format}

    def check_unchanged(self) -> None:
        """InputError if the file is not the one the job started with (its size, modification time,
        and ETag on S3): what the job wrote came from another version of it."""
        now = file_info(self.path)
        if now == (self.size, self.mtime_ns) and (self.etag is None or file_etag(self.path) == self.etag):
            return
        seen = "gone" if now is None else f"now {now[0]:,} bytes, modified at {now[1]} ns" + \
            ("" if now != (self.size, self.mtime_ns) else ", another version on the store")
        raise InputError(f"{self.path}: changed while the job ran ({seen}; it was {self.size:,} bytes, modified "
                         f"at {self.mtime_ns} ns); the shard from it is not committed. Leave the inputs alone "
                         f"while a job runs, then rerun the same command: it starts over from the changed input")


@dataclass(frozen=True)
class Shard:
    file: InputFile
    chunk: int
    start: int  # first row in the file
    rows: int
    suffix: str = ".parquet"  # its file format's (pipelines.shard_files)

    @property
    def name(self) -> str:
        return f"part-{self.file.index:05d}-{self.chunk:05d}{self.suffix}"


def _open(path: Path | str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(open_input(path) if is_uri(path) else path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: not a Parquet file or corrupt ({e})") from None


def check_schema(schema: pa.Schema, opts: EmbedOptions, where: str) -> None:
    """Every column the job reads exists, the text column has a usable type, and no column is
    called like the output column."""
    names = schema.names
    if twice := sorted({c for c in names if names.count(c) > 1}):  # columns are read by name (Arrow's datasets too)
        raise InputError(f"{where}: columns {twice} appear more than once; columns are read by name: rename the "
                         f"copies")
    missing = [c for c in opts.input_columns if c not in names]
    if missing:
        which = "--tokens-column" if opts.tokens_column in missing else "columns"
        raise InputError(f"{where}: {which} {missing} not found; the columns are {names} "
                         f"(choose with --text-column / --tokens-column / --id-column / --keep-columns)")
    if ELMO_COLUMN in opts.passthrough_columns:
        raise InputError(f"{where}: a kept column is named '{ELMO_COLUMN}', the output column's name")
    text = opts.tokens_column or opts.text_column
    check_text_type(schema.field(text).type, opts.tokens_column is not None, f"{where}: column '{text}'")


def footer_sha256(path: Path | str) -> str:
    """sha256 of a Parquet file's footer (its last 8 bytes give the footer's length)."""
    with open_input(path) as f:
        f.seek(-8, os.SEEK_END)
        n = int.from_bytes(f.read(4), "little")
        f.seek(-8 - n, os.SEEK_END)
        return hashlib.sha256(f.read(n)).hexdigest()


def input_sha256(path: Path | str, fmt: str) -> str:
    """What pins an input file's rows: a Parquet file's footer, the whole of any other."""
    return footer_sha256(path) if fmt == "parquet" else file_sha256(path)


def scan_inputs(spec: str | Path, opts: EmbedOptions) -> list[InputFile]:
    """Open every input file's footer (a Parquet file) or read it whole (the others) and check its
    columns: errors come before any output."""
    files, unread = [], []  # type: ignore[var-annotated]
    for i, (path, fmt) in enumerate(input_files(spec, unread)):
        size, mtime_ns = file_info(path) or (0, 0)
        if fmt == "parquet":
            pf = _open(path)
            schema, rows = pf.schema_arrow, pf.metadata.num_rows
            tokens = parquet_tokens(pf.metadata, opts.tokens_column or opts.text_column)
        else:
            schema, rows = input_formats.schema_and_rows(path, fmt, opts.text_column, tuple(opts.passthrough_columns))
            tokens = file_tokens(size, rows)
        check_schema(schema, opts, str(path))
        files.append(InputFile(i, path if is_uri(path) else Path(path).resolve(), rows, size, mtime_ns,
                               input_sha256(path, fmt), schema, file_etag(path), fmt, tokens))
    if unread:
        shown = ", ".join(Path(str(p)).name for p in unread[:3]) + (f" and {len(unread) - 3} more" if len(unread) > 3 else "")
        note(f"INPUT {spec}: its {len(files)} Parquet file(s) are read, not its {len(unread)} file(s) of other formats "
             f"({shown}); to embed those, give them as INPUT (a glob such as "
             f"'{str(spec).rstrip('/')}/*{Path(str(unread[0])).suffix}')", opts.quiet)
    return files


# Bytes of text a token: State of the Union's sentences hold 5.5 (tokens joined by single spaces,
# punctuation split off: corpora.sotu), English with its punctuation attached about 6. Too few
# tokens estimated lean a job to the eager layout, which forgoes a compiled layout's gain (3-6 % of
# a whole full-size job where measured); too many (CSV's other columns) to the compiled one, whose
# warm-up cost a 43k-token job 1.7x (inference.layout.choose, docs/performance.md).
BYTES_PER_TOKEN = 6


def parquet_tokens(metadata: pq.FileMetaData, column: str) -> int:
    """About how many tokens a Parquet file's text or tokens ``column`` holds, from its footer: a
    tokens column's (a list) values; a text column's bytes / ``BYTES_PER_TOKEN``, at least one a
    row (a dictionary-encoded column's bytes are its encoding's, fewer than its text's)."""
    chunks = [chunk for group in (metadata.row_group(i) for i in range(metadata.num_row_groups))
              for chunk in (group.column(j) for j in range(group.num_columns))
              if chunk.path_in_schema in (column, f"{column}.list.element", f"{column}.list.item")]
    if any(chunk.path_in_schema != column for chunk in chunks):
        return sum(chunk.num_values for chunk in chunks)
    return max(sum(chunk.total_uncompressed_size for chunk in chunks) // BYTES_PER_TOKEN, metadata.num_rows)


def file_tokens(size: int, rows: int) -> int:
    """About how many tokens a file of another format holds: its bytes / ``BYTES_PER_TOKEN``, at
    least one a row (a text file is its text; CSV's and JSON Lines' other columns count too)."""
    return max(size // BYTES_PER_TOKEN, rows)


def passthrough_schema(files: list[InputFile], opts: EmbedOptions) -> pa.Schema:
    """The id and kept columns' one type each, the same in every input file (else an error naming
    the files, the column and the types): every shard is then written with one schema."""
    fields = []
    for name in opts.passthrough_columns:
        types: dict[pa.DataType, list[InputFile]] = {}
        for f in files:
            types.setdefault(f.schema.field(name).type, []).append(f)
        if len(types) > 1:
            names = {t: [str(f.path).rsplit("/", 1)[-1] for f in group] for t, group in types.items()}
            found = "; ".join(f"{t} in {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
                              for t, paths in names.items())
            raise InputError(f"column '{name}' has different types in the input files ({found}); every file "
                             f"must give it one type: {_one_type(types)}, or leave the column out")
        fields.append(pa.field(name, next(iter(types))))
    return pa.schema(fields)


def _one_type(types: dict[pa.DataType, list[InputFile]]) -> str:
    """How the files give a column one type, where they give it ``types`` (each type's files): a CSV
    or TSV file gives only strings, so where one is among them every other file follows it; else
    the advice follows the files that differ (``_odd_files``)."""
    if any(f.format in ("csv", "tsv") for group in types.values() for f in group):
        return "a CSV or TSV column is read as strings (the characters of its fields): give it as strings in every file"
    if any(f.format == "jsonl" for f in _odd_files(types)):
        return ("a JSON Lines key keeps JSON's types: write its values alike in every file (all integers, all "
                "numbers with a fraction, or all strings)")
    return "rewrite the odd files with that type"


def _odd_files(types: dict[pa.DataType, list[InputFile]]) -> list[InputFile]:
    """The files whose type differs from the one most files give the column; every file where no type
    is given by more files than each other type."""
    sizes = sorted((len(group) for group in types.values()), reverse=True)
    most = max(types.values(), key=len) if sizes[0] > sizes[1] else None
    return [f for group in types.values() if group is not most for f in group]


def shards_of(files: list[InputFile], rows_per_shard: int, suffix: str = ".parquet") -> list[Shard]:
    return [Shard(f, k, k * rows_per_shard, max(0, min(rows_per_shard, f.rows - k * rows_per_shard)), suffix)
            for f in files for k in range(max(1, -(-f.rows // rows_per_shard)))]  # an empty file: one empty shard


@dataclass(frozen=True)
class Piece:
    """A shard's consecutive rows in a window: ``rows`` of them, its last ones where ``last``;
    ``shard`` None: rows of a shard not asked for (committed already), computed with the window
    and dropped."""

    shard: Shard | None
    rows: int
    last: bool


@dataclass(frozen=True)
class Window:
    """Rows sorted and batched together (``table``): ``file``'s rows from ``start`` on, in order,
    each piece's in turn."""

    table: pa.Table
    pieces: tuple[Piece, ...]
    file: InputFile
    start: int


def read_windows(file: InputFile, shards: list[Shard], opts: EmbedOptions, span: bool = False) -> Iterator[Window]:
    """The rows of the given shards of one file, in order, as windows of at most ``sort_window_rows``
    rows and ``sort_window_tokens`` tokens (a longer single row goes alone). A shard with zero rows
    comes as a window of its own with one empty piece.

    ``span`` (a job's local runner): a window goes on past a shard's end, so the model's batches do
    not shrink with the shards (a GPU job's shards are cut small for its writer threads:
    ``pipelines.shard_size``), and each piece goes to its shard's writer. The windows are then the
    file's whatever the shards asked for: a window holding rows of a shard not asked for (a resume)
    is read whole, those rows in pieces without a shard, so that every row's vectors are those of
    the whole job, bit for bit. Else (a cluster's task, given one shard) windows stay within a shard
    and the rows of shards not asked for are skipped.

    The token bound keeps a window's vectors (tokens x D floats, x(L+1) for output all) the same
    size whatever the corpus's sentence lengths, so memory does not grow with longer rows.
    """
    wanted = {s.chunk: s for s in shards}
    tables: list[pa.RecordBatch] = []
    pieces: list[Piece] = []
    rows, tokens, row = 0, 0, 0  # the window's rows and tokens; the file row read next
    for batch in input_batches(file, opts):
        counts = token_counts(batch, opts)  # (R,)
        while batch.num_rows:
            if row >= file.rows:
                raise InputError(f"{file.path}: read more than the {file.rows} rows its footer says")
            chunk = row // opts.rows_per_shard
            shard, shard_end = wanted.get(chunk), min(file.rows, (chunk + 1) * opts.rows_per_shard)
            if shard is None and not span:  # committed already: skipped
                take = min(batch.num_rows, shard_end - row)
                batch, counts, row = batch.slice(take), counts[take:], row + take
                continue
            fit = _rows_that_fit(counts, opts.sort_window_tokens - tokens, rows == 0)
            take = min(batch.num_rows, opts.sort_window_rows - rows, shard_end - row, fit)
            if take:
                tables.append(batch.slice(0, take))
                before = pieces.pop().rows if pieces and pieces[-1].shard is shard else 0
                pieces.append(Piece(shard, before + take, row + take == shard_end))
            rows, tokens = rows + take, tokens + int(counts[:take].sum())
            batch, counts, row = batch.slice(take), counts[take:], row + take
            if rows == opts.sort_window_rows or (batch.num_rows > 0 and take == fit) or (row == shard_end and not span):
                yield from _window(tables, pieces, file, row - rows)
                tables, pieces, rows, tokens = [], [], 0, 0
    if row != file.rows:
        raise InputError(f"{file.path}: read {row} rows, its footer says {file.rows}")
    yield from _window(tables, pieces, file, row - rows)
    for s in shards:
        if s.rows == 0:
            empty = pa.table({c: pa.array([], type=file.schema.field(c).type) for c in opts.input_columns})
            yield Window(empty, (Piece(s, 0, True),), file, s.start)


def _window(tables: list[pa.RecordBatch], pieces: list[Piece], file: InputFile, start: int) -> Iterator[Window]:
    """The window of these rows, where any of them is asked for."""
    if any(p.shard is not None for p in pieces):
        yield Window(pa.Table.from_batches(tables), tuple(pieces), file, start)


def token_counts(batch: pa.RecordBatch, opts: EmbedOptions) -> np.ndarray:
    """Shape: (R,) tokens per row (0 for null), to bound windows; a column of the wrong type counts
    0 here and gets its clear error from the predictor."""
    column = batch.column(opts.tokens_column or opts.text_column)
    if opts.tokens_column and (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        counts = pc.list_value_length(column)
    elif not opts.tokens_column and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        counts = pc.count_substring_regex(column, TOKEN_PATTERN)  # split_tokens' tokens
    else:
        return np.zeros(batch.num_rows, np.int64)
    return counts.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _rows_that_fit(counts: np.ndarray, room: int, at_least_one: bool) -> int:
    """How many leading rows of ``counts`` fit in ``room`` tokens (at least one into an empty window)."""
    fit = int(np.searchsorted(np.cumsum(counts), room, side="right"))
    return max(fit, 1) if at_least_one else fit


def open_dataset(file: InputFile) -> ds.Dataset:
    """The input file as a pyarrow dataset, wherever it lives (pyarrow.dataset, which loads pandas,
    imported here: a check of the inputs answers without it)."""
    import pyarrow.dataset as ds

    path, fs = dataset_source(file.path)
    return ds.dataset(path, filesystem=fs, format="parquet")


def input_batches(file: InputFile, opts: EmbedOptions) -> Iterator[pa.RecordBatch]:
    """The file's rows, the job's columns, in file order."""
    if file.format != "parquet":
        for batch in input_formats.batches(file.path, file.format, opts.text_column, opts.sort_window_rows):
            yield batch.select(opts.input_columns)
        return
    dataset = open_dataset(file)
    try:
        yield from dataset.to_batches(columns=opts.input_columns, batch_size=opts.sort_window_rows,
                                      batch_readahead=2, fragment_readahead=1, use_threads=True)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise InputError(f"{file.path}: cannot read its rows, the file is corrupt ({e})") from None
