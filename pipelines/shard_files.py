"""The file format of an output shard: Parquet (``--format parquet``) or Arrow IPC (``--format
arrow``, Feather v2, memory-mappable). Everything the job's protocol needs of a shard file is here:
its name's suffix, a writer, the ``elmo.shard`` record it carries with its row count, and reading
its batches back; the protocol itself (commit records, verification, resume) is the same for both
(``pipelines.sink``, ``pipelines.verify``). A shard's format is read from its name, so a reader
needs no option.

The record: Parquet writes it in the footer's key-value metadata as the shard is closed, with the
shard's counts; Arrow IPC its identity (the rows the shard must hold) in the schema's metadata as
the file is opened (an IPC file's schema is written first) and the whole record, counts too, in the
metadata of a last record batch of no rows as it is closed. Either way ``footer`` returns it with
the rows the file actually holds (``footer_rows``), which every check compares.

A job's side records (``pipelines.sink``: the job, each shard's commit, the manifest) are files of
the shard format too, with the job's schema and no rows, the record in the schema's metadata
(``elmo.record``): a reader given OUTPUT_DIR reads them as no rows, so pyarrow, DuckDB, polars
(which takes every non-empty file under a directory and wants one extension), pandas and Spark
read the directory as it is.

Measured (pyarrow alone, float16, D = 1,024, one core, AMX Xeon): Parquet float lists 61k tokens/s
(a repetition and definition level per float), Parquet fixed-size binary 346k, Arrow IPC 654k;
snappy, lz4 and none within 10 % of each other, zstd 0.6-0.9x at 8 % smaller (docs/pipelines.md).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from elmo_core.errors import InputError

from .schema import parquet_options

SHARD_KEY, RECORD_KEY = b"elmo.shard", b"elmo.record"


@dataclass(frozen=True)
class ShardFormat:
    """One shard file format: ``name`` (``--format``), ``suffix``, the compressions it writes (the
    default first)."""

    name: str
    suffix: str
    compressions: tuple[str, ...]

    def writer(self, file: BinaryIO, schema: pa.Schema, compression: str, record: dict) -> "ShardFileWriter":
        """A writer of one shard; ``record``: the shard's identity, known before its rows."""
        if self.name == "parquet":
            return _ParquetWriter(pq.ParquetWriter(file, schema, **parquet_options(schema, compression)))
        meta = {**(schema.metadata or {}), SHARD_KEY: json.dumps(record, sort_keys=True)}
        options = ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        return _ArrowWriter(ipc.new_file(file, schema.with_metadata(meta), options=options), schema)

    def footer(self, file: BinaryIO) -> tuple[dict | None, int]:
        """(the ``elmo.shard`` record or None, the rows the file holds); pyarrow's errors where the
        file is not one of this format."""
        if self.name == "parquet":
            meta = pq.read_metadata(file)
            raw, rows = (meta.metadata or {}).get(SHARD_KEY), meta.num_rows
        else:  # the record with the counts in the last batch's metadata (``_ArrowWriter.close``), else the identity
            reader = ipc.open_file(file)
            last = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1)[1] \
                if reader.num_record_batches else None
            raw = (last or {}).get(SHARD_KEY) or (reader.schema.metadata or {}).get(SHARD_KEY)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        try:
            record = json.loads(raw) if raw is not None else None
        except ValueError:
            record = None
        return (record if isinstance(record, dict) else None), rows

    def record_bytes(self, schema: pa.Schema, record: dict) -> bytes:
        """A side record as a file of this format: ``schema``, no rows, ``record`` in its metadata."""
        empty = schema.with_metadata({**(schema.metadata or {}), RECORD_KEY: json.dumps(record, sort_keys=True)})
        sink = pa.BufferOutputStream()
        if self.name == "parquet":
            pq.write_table(empty.empty_table(), sink, **parquet_options(schema))
        else:
            ipc.new_file(sink, empty).close()
        return sink.getvalue().to_pybytes()

    def read_record(self, data: bytes) -> dict | None:
        """The record ``record_bytes`` wrote into ``data``; None where it holds none; pyarrow's
        errors where ``data`` is not a file of this format."""
        if self.name == "parquet":
            meta = pq.read_metadata(pa.BufferReader(data)).metadata
        else:
            meta = ipc.open_file(pa.BufferReader(data)).schema.metadata
        try:
            record = json.loads((meta or {})[RECORD_KEY])
        except (KeyError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def batches(self, file: BinaryIO, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The file's rows, a row group (Parquet) or record batch (Arrow) at a time."""
        if self.name == "parquet":
            yield from pq.ParquetFile(file).iter_batches(columns=columns)
            return
        reader = ipc.open_file(file)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i).select(columns)

    def schema(self, file: BinaryIO) -> pa.Schema:
        return pq.read_schema(file) if self.name == "parquet" else ipc.open_file(file).schema

    def read_table(self, file: BinaryIO, columns: list[str]) -> pa.Table:
        if self.name == "parquet":
            return pq.read_table(file, columns=columns)
        return ipc.open_file(file).read_all().select(columns)


ROW_GROUP_BYTES = 16 << 20  # a Parquet row group's bytes of Arrow data, at the piece's average row (at least one row)
LEVEL_CHUNK_BYTES = 1 << 20  # the Arrow data pyarrow builds a column's levels for at once, at the piece's average row


class _ParquetWriter:
    """Row groups of about ``ROW_GROUP_BYTES`` (as many rows as the piece's average row fits), each
    handed to pyarrow in chunks of about ``LEVEL_CHUNK_BYTES``: pyarrow builds the repetition and
    definition levels of a column chunk's Arrow array at once, ~10 bytes of memory a byte of float16
    vectors (a 66 MB piece in 16 MiB groups: 188 MB of its pool at the peak, fresh pages a group,
    zeroed by the kernel; in 1 MiB chunks: 19 MB, reused). The file is the same either way."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer

    def write(self, table: pa.Table) -> None:
        chunks = table.to_batches(max_chunksize=_rows_of(table, LEVEL_CHUNK_BYTES))
        if chunks:
            table = pa.Table.from_batches(chunks, table.schema)
        self.writer.write_table(table, row_group_size=_rows_of(table, ROW_GROUP_BYTES))

    def close(self, record: dict | None = None) -> None:
        if record is not None:
            self.writer.add_key_value_metadata({SHARD_KEY: json.dumps(record, sort_keys=True)})
        self.writer.close()


def _rows_of(table: pa.Table, size: int) -> int:
    """As many of ``table``'s rows as ``size`` bytes hold at its average row (at least one)."""
    return max(1, size * table.num_rows // max(1, table.nbytes))


class _ArrowWriter:
    """An Arrow IPC file whose schema's metadata holds the shard's identity (written first) and whose
    last record batch, of no rows, holds in its own metadata the whole record (the counts known at
    its close, as a Parquet footer's): what a shard published without its commit record is adopted by."""

    def __init__(self, writer: Any, schema: pa.Schema) -> None:
        self.writer, self.schema = writer, schema

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table, max_chunksize=max(1, table.num_rows))

    def close(self, record: dict | None = None) -> None:
        if record is not None:
            empty = pa.RecordBatch.from_pylist([], schema=self.schema)
            self.writer.write_batch(empty, custom_metadata={SHARD_KEY: json.dumps(record, sort_keys=True)})
        self.writer.close()


ShardFileWriter = _ParquetWriter | _ArrowWriter
FORMATS = {f.name: f for f in (ShardFormat("parquet", ".parquet", ("snappy", "none", "lz4", "zstd")),
                               ShardFormat("arrow", ".arrow", ("none", "lz4", "zstd")))}


def shard_format(name: str) -> ShardFormat:
    """The format of a shard file, by its name's suffix."""
    for f in FORMATS.values():
        if name.endswith(f.suffix):
            return f
    raise InputError(f"{name}: not an output shard (its name ends in none of "
                     f"{', '.join(f.suffix for f in FORMATS.values())})")
