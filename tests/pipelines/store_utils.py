"""Helpers of the object-store tests (the server is the ``s3`` fixture of conftest.py)."""
from __future__ import annotations

from pathlib import Path


def upload(fs, local: Path, prefix: str) -> str:  # type: ignore[no-untyped-def]
    """Copy a local directory's files to ``prefix`` (bucket/key) on the store; its s3:// URI."""
    for f in sorted(local.iterdir()):
        with fs.open_output_stream(f"{prefix}/{f.name}") as out:
            out.write(f.read_bytes())
    return f"s3://{prefix}"
