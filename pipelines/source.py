"""The input side: resolving INPUT to Parquet files, checking them before anything is written,
and streaming each shard's rows as windows of record batches with column projection.

Shards: input file i (in sorted path order) is cut into shards of ``rows_per_shard`` rows;
shard (i, k) holds rows [k * rows_per_shard, (k + 1) * rows_per_shard) of file i and is written
as ``part-{i:05d}-{k:05d}.parquet``. Sorting the output names therefore gives the input order.
"""
from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from elmo_core.errors import InputError

from .options import EmbedOptions
from .predictor import ELMO_COLUMN


@dataclass(frozen=True)
class InputFile:
    index: int
    path: Path
    rows: int
    size: int


@dataclass(frozen=True)
class Shard:
    file: InputFile
    chunk: int
    start: int  # first row in the file
    rows: int

    @property
    def name(self) -> str:
        return f"part-{self.file.index:05d}-{self.chunk:05d}.parquet"


PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


def resolve_inputs(spec: str | Path) -> list[Path]:
    """A Parquet file, a directory (its *.parquet, recursively, hidden names skipped) or a glob."""
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in PARQUET_SUFFIXES and p.is_file()
                       and not any(part.startswith((".", "_")) for part in p.relative_to(path).parts))
        if not files:
            raise InputError(f"{path}: no Parquet files ({', '.join(PARQUET_SUFFIXES)}) in this directory")
        return files
    matches = sorted(Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file())
    if not matches:
        raise InputError(f"{spec}: no such file, directory, or files matching this pattern")
    return matches


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: not a Parquet file or corrupt ({e})") from None


def check_schema(schema: pa.Schema, opts: EmbedOptions, where: str) -> None:
    """Every column the job reads exists, and none is called like the output column."""
    names = schema.names
    missing = [c for c in opts.input_columns if c not in names]
    if missing:
        which = "--tokens-column" if opts.tokens_column in missing else "columns"
        raise InputError(f"{where}: {which} {missing} not found; the columns are {names} "
                         f"(choose with --text-column / --tokens-column / --id-column / --keep-columns)")
    if ELMO_COLUMN in opts.passthrough_columns:
        raise InputError(f"{where}: a kept column is named '{ELMO_COLUMN}', the output column's name")


def scan_inputs(spec: str | Path, opts: EmbedOptions) -> list[InputFile]:
    """Open every input file's footer and check its columns: errors come before any output."""
    files = []
    for i, path in enumerate(resolve_inputs(spec)):
        pf = _open(path)
        check_schema(pf.schema_arrow, opts, str(path))
        files.append(InputFile(i, path.resolve(), pf.metadata.num_rows, path.stat().st_size))
    return files


def shards_of(files: list[InputFile], rows_per_shard: int) -> list[Shard]:
    shards = []
    for f in files:
        n_chunks = max(1, -(-f.rows // rows_per_shard))  # an empty file still gets one (empty) shard
        for k in range(n_chunks):
            start = k * rows_per_shard
            shards.append(Shard(f, k, start, max(0, min(rows_per_shard, f.rows - start))))
    return shards


def read_windows(file: InputFile, shards: list[Shard], opts: EmbedOptions) -> Iterator[tuple[Shard, pa.Table, bool]]:
    """(shard, rows, is_last) for the given shards of one file, in order; at most ``sort_window_rows``
    rows each, never across two shards. A shard with zero rows yields one empty table.
    Rows of shards not asked for are read and skipped (a resume re-reads text, not vectors).
    """
    wanted = {s.chunk: s for s in shards}
    pending: list[pa.RecordBatch] = []
    pending_rows, row = 0, 0  # rows buffered, and the file row of the first buffered one
    for batch in _batches(file, opts):
        while batch.num_rows:
            shard_end = min(file.rows, (row // opts.rows_per_shard + 1) * opts.rows_per_shard)
            take = min(batch.num_rows, opts.sort_window_rows - pending_rows, shard_end - row - pending_rows)
            pending.append(batch.slice(0, take))
            pending_rows, batch = pending_rows + take, batch.slice(take)
            done = row + pending_rows == shard_end
            if done or pending_rows == opts.sort_window_rows:
                shard = wanted.get(row // opts.rows_per_shard)
                if shard is not None:
                    yield shard, pa.Table.from_batches(pending), done
                row, pending, pending_rows = row + pending_rows, [], 0
    if row != file.rows or pending_rows:
        raise InputError(f"{file.path}: read {row + pending_rows} rows, its footer says {file.rows}")
    for s in shards:
        if s.rows == 0:
            yield s, _empty_table(file, opts), True


def _empty_table(file: InputFile, opts: EmbedOptions) -> pa.Table:
    schema = file_schema(file)
    return pa.table({c: pa.array([], type=schema.field(c).type) for c in opts.input_columns})


def file_schema(file: InputFile) -> pa.Schema:
    return _open(file.path).schema_arrow


def _batches(file: InputFile, opts: EmbedOptions) -> Iterator[pa.RecordBatch]:
    dataset = ds.dataset(str(file.path), format="parquet")
    try:
        yield from dataset.to_batches(columns=opts.input_columns, batch_size=opts.sort_window_rows,
                                      batch_readahead=2, fragment_readahead=1, use_threads=True)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise InputError(f"{file.path}: cannot read its rows, the file is corrupt ({e})") from None
