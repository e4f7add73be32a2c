"""The output's one schema and Parquet settings, used by every writer (local and Ray runners).

Output columns: the ``--id-column``, the ``--keep-columns`` (as in the input), then ``elmo``
(D = 2P, L+1 = the model's output layers, float = float32 or float16):
  - output mixed / top / average: ``list<fixed_size_list<float, D>>``, one D-vector per token;
  - output all: ``list<fixed_size_list<fixed_size_list<float, D>, L+1>>``: per token, its L+1
    layers (layer 0 = the char-CNN token layer, then each biLSTM layer), i.e. (T, L+1, D) per row.
A null text gives a null ``elmo``; an empty or whitespace-only text gives an empty list.
With ``--pool mean|max`` the column holds one vector per row instead (the outer list dropped:
``fixed_size_list<float, D>``, or ``fixed_size_list<fixed_size_list<float, D>, L+1>`` for output
all), pooled over the row's tokens; null for a null or empty text.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from inference.outputs import VectorRequest

ELMO_COLUMN = "elmo"
COMPRESSIONS = ("snappy", "none", "lz4", "zstd")  # of the output shards; measured in docs/pipelines.md


def elmo_type(dim: int, n_layers: int, request: VectorRequest) -> pa.DataType:
    """Shape: the Arrow type of the ``elmo`` column, derived from the request (see the module doc)."""
    item = request.mode.arrow(dim, n_layers, request.vector_dtype)
    return item if request.pool else pa.list_(item)


def output_schema(passthrough: pa.Schema, dim: int, n_layers: int, request: VectorRequest) -> pa.Schema:
    """The passed-through columns (id, kept columns, in order) followed by ``elmo``."""
    return passthrough.append(pa.field(ELMO_COLUMN, elmo_type(dim, n_layers, request)))


def parquet_options(schema: pa.Schema, compression: str = COMPRESSIONS[0]) -> dict[str, Any]:
    """``pyarrow.parquet.ParquetWriter`` keyword arguments for an output shard: ``compression`` for
    every column (the vectors are nearly all of it), page checksums on; dictionary encoding only
    for the passed-through columns that are not floats or lists (dictionaries of float vectors
    cost time and save nothing); min/max statistics for every column but the vectors (no query
    filters on a vector's components, and they cost a quarter of the write: measured float16,
    D = 1024, snappy, one core, 39.1k tokens/s with them, 52.7k without)."""
    vectors_and_lists = {f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_floating(f.type)}
    return {"compression": compression, "write_page_checksum": True,
            "use_dictionary": [f.name for f in schema if f.name not in vectors_and_lists],
            "write_statistics": [f.name for f in schema if f.name != ELMO_COLUMN]}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: the same names and types; nullability and field metadata follow the
    schema (an input file may mark its id column non-nullable)."""
    if table.schema.equals(schema):
        return table
    if table.schema.names != schema.names or any(a.type != b.type for a, b in zip(table.schema, schema)):
        raise ValueError(f"a batch has the schema {table.schema}, the output's is {schema}")
    return pa.Table.from_arrays(table.columns, schema=schema)
