"""Helpers of the object-store tests (the server is the ``s3`` fixture of conftest.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

# A small, slow job: 10 shards of 30 rows, batches of at most 300 tokens, one thread.
STORE_RUN = ["--id-column", "id", "--rows-per-shard", "30", "--sort-window-rows", "15", "--max-batch-tokens", "300",
             "--threads", "1", "--quiet"]


def upload(fs, local: Path, prefix: str) -> str:  # type: ignore[no-untyped-def]
    """Copy a local directory's files to ``prefix`` (bucket/key) on the store; its s3:// URI."""
    for f in sorted(local.iterdir()):
        with fs.open_output_stream(f"{prefix}/{f.name}") as out:
            out.write(f.read_bytes())
    return f"s3://{prefix}"


def store_table(fs, prefix: str):  # type: ignore[no-untyped-def]
    """What a reader of the store sees: pyarrow.dataset over the prefix (``_`` and ``.`` names skipped)."""
    return ds.dataset(prefix, format="parquet", filesystem=fs).to_table()


def store_vectors(table) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.concatenate([np.asarray(v, np.float32) for v in table.column("elmo").to_pylist()])  # (N, D)


def store_names(fs, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    import pyarrow.fs as pafs
    selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return sorted(i.path[len(prefix) + 1:] for i in fs.get_file_info(selector) if i.is_file)
