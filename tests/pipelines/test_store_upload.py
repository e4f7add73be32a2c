"""A shard's upload to an object store (``pipelines/store_upload.py``), against a real
S3-compatible server on 127.0.0.1: conditional multipart uploads that appear whole or not at all."""
from __future__ import annotations

import hashlib

import numpy as np

from pipelines import store_upload
from pipelines.output_dir import open_output
from storage.locations import s3_client


def test_a_large_shard_travels_in_parts_and_appears_whole(s3, monkeypatch):
    """Parts of 5 MiB (the store's minimum), sent while more is written: the object appears only
    when completed, byte for byte, with the sha256 of what was written; an aborted one never does."""
    monkeypatch.setattr(store_upload, "PART_BYTES", 5 << 20)
    s3.create_dir("parts")
    out, data = open_output("s3://parts/out"), np.random.default_rng(0).bytes((12 << 20) + 123)
    upload = out.shard_sink("part-00000-00000.parquet")
    for i in range(0, len(data), 1 << 20):
        upload.write(data[i:i + (1 << 20)])
    assert out.size("part-00000-00000.parquet") is None  # three parts sent or travelling, nothing visible
    record = upload.finish()
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["bytes"] == len(data)
    assert record["etag"].endswith('-3"') and s3.open_input_stream("parts/out/part-00000-00000.parquet").read() == data

    aborted = out.shard_sink("part-00000-00001.parquet")
    aborted.write(data[: 6 << 20])
    aborted.abort()
    assert out.size("part-00000-00001.parquet") is None
    assert not s3_client().list_multipart_uploads(Bucket="parts").get("Uploads")
