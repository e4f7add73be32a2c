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

import json
from typing import Any

import numpy as np
import pyarrow as pa

from elmo_core.kinds import Dtype
from elmo_core.vectors import VectorRequest

ELMO_COLUMN = "elmo"
VECTOR_DTYPE, VECTOR_SHAPE = b"elmo.dtype", b"elmo.shape"  # a binary layout's field metadata
COMPRESSIONS = ("snappy", "none", "lz4", "zstd")  # of the output shards; measured in docs/pipelines.md


def arrow_float(dtype: Dtype) -> pa.DataType:
    """A vector dtype's Arrow type (``float32``, ``float16``)."""
    return pa.from_numpy_dtype(dtype.numpy)


def elmo_type(dim: int, n_layers: int, request: VectorRequest, layout: str = "floats") -> pa.DataType:
    """Shape: the Arrow type of the ``elmo`` column, derived from the request (see the module doc);
    ``layout`` binary: each vector's bytes (``vector_item``)."""
    item = vector_item(dim, n_layers, request, layout)
    return item if request.pool else pa.list_(item)


def vector_item(dim: int, n_layers: int, request: VectorRequest, layout: str = "floats") -> pa.DataType:
    """One token's (or pooled row's) vectors: ``fixed_size_list<float, D>`` (nested L+1 times for
    output all), or with ``layout`` binary ``fixed_size_binary(D x [L+1] x itemsize)``."""
    if layout == "floats":
        item = pa.list_(arrow_float(request.vector_dtype), dim)
        return pa.list_(item, n_layers) if request.mode.layer_axis else item
    shape = request.mode.shape(n_layers, dim)
    return pa.binary(int(np.prod(shape)) * request.vector_dtype.itemsize)


def elmo_field(dim: int, n_layers: int, request: VectorRequest, layout: str = "floats") -> pa.Field:
    """The ``elmo`` column; a binary layout's dtype and shape in its metadata (``vector_array``)."""
    meta = {VECTOR_DTYPE: request.vector_dtype.name,
            VECTOR_SHAPE: json.dumps(list(request.mode.shape(n_layers, dim)))} if layout == "binary" else None
    return pa.field(ELMO_COLUMN, elmo_type(dim, n_layers, request, layout), metadata=meta)


def vectors_of(field: pa.Field) -> dict[str, Any] | None:
    """What an ``elmo`` column holds (``elmo_field`` read back): whether a row's tokens were pooled
    into one vector, each vector's layers (None: the layers reduced to one), width and dtype; None
    for a field that is not such a column."""
    item = field.type.value_type if pa.types.is_list(field.type) else field.type
    try:
        shape, dtype = _vector_shape(item, field.metadata or {})
    except (KeyError, ValueError, TypeError):
        return None
    if dtype is None or not isinstance(shape, list) or len(shape) not in (1, 2):
        return None
    return {"pooled": not pa.types.is_list(field.type), "layers": shape[0] if len(shape) == 2 else None,
            "dim": shape[-1], "dtype": dtype}


def _vector_shape(item: pa.DataType, meta: dict) -> tuple[list[int], str | None]:
    """One vector's shape ([L+1,] D) and numpy dtype name (None: not floats) from an ``elmo`` column's
    item type: the binary layout's from its field's ``meta`` (KeyError where it names none), the
    float layout's from its nested fixed-size lists."""
    if pa.types.is_fixed_size_binary(item):
        return json.loads(meta[VECTOR_SHAPE]), np.dtype(meta[VECTOR_DTYPE].decode()).name
    shape = []
    while pa.types.is_fixed_size_list(item):
        shape.append(item.list_size)
        item = item.value_type
    return shape, (np.dtype(item.to_pandas_dtype()).name if pa.types.is_floating(item) else None)


def output_schema(passthrough: pa.Schema, dim: int, n_layers: int, request: VectorRequest,
                  layout: str = "floats") -> pa.Schema:
    """The passed-through columns (id, kept columns, in order) followed by ``elmo``."""
    return passthrough.append(elmo_field(dim, n_layers, request, layout))


def vector_array(column: pa.Array | pa.ChunkedArray, field: pa.Field | None = None) -> np.ndarray:
    """The vectors of an ``elmo`` column as one numpy array, every token's (or pooled row's) in
    order, nulls and empty rows holding none: (N, D) or (N, L+1, D). Without a copy where the
    column is one chunk without nulls among its vectors: the binary layout's bytes viewed in the
    dtype its ``field``'s metadata names (``elmo.dtype``, ``elmo.shape``), the float layout's values.
    ``torch.from_numpy`` of it is a tensor on the same memory."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_chunk_vectors(c, field) for c in chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _chunk_vectors(column: pa.Array, field: pa.Field | None) -> np.ndarray:
    items = column.flatten() if pa.types.is_list(column.type) else column.drop_null()  # tokens, or pooled rows
    if pa.types.is_fixed_size_binary(items.type):
        meta = (field.metadata if field is not None else None) or {}
        if VECTOR_DTYPE not in meta:
            raise ValueError("a binary vector column needs its field (pipelines.schema.elmo_field) for its dtype and "
                             "shape: pass table.schema.field('elmo')")
        shape, dtype = _vector_shape(items.type, meta)
        start = items.offset * items.type.byte_width
        raw = np.frombuffer(items.buffers()[1], dtype=np.uint8)[start:start + len(items) * items.type.byte_width]
        return raw.view(dtype).reshape(len(items), *shape)
    shape, _ = _vector_shape(items.type, {})
    for _ in shape:  # the nested lists' values, in order
        items = items.flatten()
    return items.to_numpy(zero_copy_only=False).reshape(-1, *shape)


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
