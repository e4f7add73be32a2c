"""A shard's bytes streamed to an object store as they are encoded (``StoreDir.shard_sink``).

The Parquet writer writes into a ``StoreUpload``; each 16 MiB becomes a part of a multipart upload,
sent by a thread of its own while the writer goes on encoding (at most ``IN_FLIGHT`` parts
travel at once, so a writer holds at most ``IN_FLIGHT + 1`` parts in memory). A shard smaller than
one part is one PUT. Nothing is visible until ``finish`` completes the upload, conditionally
(``If-None-Match: *``): the object appears whole, and only if no object has its name yet. An
upload that never completes (a killed writer) stays invisible; ``--resume`` aborts it.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from storage.locations import redacted, s3_client

from .errors import OutputDirError, ShardPublishedError

PART_BYTES = 16 << 20  # a part (the store's minimum is 5 MiB; at most 10,000 parts: shards up to 160 GB)
IN_FLIGHT = 2


class StoreUpload(io.RawIOBase):
    """A writable file whose bytes become object ``name`` of ``out`` (a ``StoreDir``) at ``finish``,
    hashed (sha256) on the way; ``publish`` has nothing left to do."""

    def __init__(self, out: Any, name: str) -> None:
        super().__init__()
        self.out, self.name, self.key = out, name, out.key(name)
        self.buffer, self.parts, self.upload_id = bytearray(), [], None
        self.hash, self.bytes = hashlib.sha256(), 0
        self.pool: ThreadPoolExecutor | None = None
        self.file: Any = self

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.buffer += data  # copied: ``data`` may be a job window's leased buffer (runtime/buffers.py)
        self.hash.update(data)
        self.bytes += len(data)
        if len(self.buffer) >= PART_BYTES:
            self._send_part()
        return len(data)

    def tell(self) -> int:
        return self.bytes

    def written(self) -> None:
        """Nothing to do: the bytes were hashed as they came (``write``), as a local shard's are after each table."""

    def _send_part(self) -> None:
        """Hand the buffer to the upload thread; wait while ``IN_FLIGHT`` parts travel; raise a failed one's error."""
        if self.upload_id is None:
            with self.out._errors(self.name):
                self.upload_id = s3_client().create_multipart_upload(Bucket=self.out.bucket, Key=self.key)["UploadId"]
            self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="elmo-upload")
        body, self.buffer = self.buffer, bytearray()  # handed over, not copied
        self.parts.append(self.pool.submit(self._upload_part, len(self.parts) + 1, body))  # type: ignore[union-attr]
        travelling = [f for f in self.parts if not f.done()]
        while len(travelling) > IN_FLIGHT:
            wait(travelling, return_when=FIRST_COMPLETED)
            travelling = [f for f in travelling if not f.done()]
        for f in self.parts:
            if f.done():
                f.result()  # a part's error, here rather than at the end

    def _upload_part(self, number: int, body: bytearray) -> dict:
        with self.out._errors(self.name):
            etag = s3_client().upload_part(Bucket=self.out.bucket, Key=self.key, UploadId=self.upload_id,
                                           PartNumber=number, Body=body)["ETag"]
        return {"PartNumber": number, "ETag": etag}

    def finish(self) -> dict:
        """Complete the upload if no object has the name yet: {"sha256", "bytes", "etag"}."""
        from botocore.exceptions import ClientError
        client, where = s3_client(), self.out.where(self.name)
        try:
            if self.upload_id is None:
                etag = client.put_object(Bucket=self.out.bucket, Key=self.key, Body=bytes(self.buffer),
                                         IfNoneMatch="*")["ETag"]
            else:
                self._send_part()
                parts = [f.result() for f in self.parts]
                etag = client.complete_multipart_upload(Bucket=self.out.bucket, Key=self.key, UploadId=self.upload_id,
                                                        MultipartUpload={"Parts": parts}, IfNoneMatch="*")["ETag"]
        except (ClientError, OutputDirError) as e:
            self.abort()
            if isinstance(e, ClientError) and \
                    e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise ShardPublishedError(f"{where}: another writer created it while this one wrote it (a retried "
                                          f"or speculative task, or an earlier attempt still running)") from None
            raise OutputDirError(f"{where}: {redacted(e)}") from None
        self.upload_id = None
        self._stop_pool()
        return {"sha256": self.hash.hexdigest(), "bytes": self.bytes, "etag": etag}

    def publish(self) -> None:
        """Completed by ``finish``: nothing to rename."""

    def abort(self) -> None:
        """Drop what was sent: the parts in flight are awaited, the upload aborted (best effort:
        ``--resume`` aborts what is left)."""
        from botocore.exceptions import BotoCoreError, ClientError
        self._stop_pool()
        if self.upload_id is not None:
            with contextlib.suppress(ClientError, BotoCoreError):
                s3_client().abort_multipart_upload(Bucket=self.out.bucket, Key=self.key, UploadId=self.upload_id)
            self.upload_id = None
        self.buffer = bytearray()

    def _stop_pool(self) -> None:
        if self.pool is not None:
            for f in self.parts:
                f.cancel()  # parts not yet sent; those in flight finish
            self.pool.shutdown(wait=True)
            self.pool = None
