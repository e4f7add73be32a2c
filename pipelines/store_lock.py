"""One job at a time on an OUTPUT_DIR in an object store: a lease held in ``OUTPUT_DIR/.elmo.lock``.

No kernel releases a lock on a store when its holder dies, so the lock is a lease, taken and
renewed by conditional writes only, which is what we rely on from the store: a PUT with
``If-None-Match: *`` creates the object only if there is none, a PUT with ``If-Match: ETAG`` replaces
it only if it is still the version read (S3 since 2024; MinIO; moto). So two drivers can never both
hold it:

- take: create the object (``If-None-Match``); if it exists and is free (released, its lease run
  out by the store's own clock, or its holder a dead process on this host), replace that very
  version (``If-Match``): of two drivers racing for it, one wins, the other is refused;
- hold: a thread renews the lease every ``lease/4`` s (``If-Match`` on the version it wrote); if
  that fails, another driver took the lock after this one's lease ran out: the job stops before
  it writes its manifest (``check``);
- release: a job that finished deletes it if it is still the version the job wrote (``If-Match``
  on the delete), so a finished output keeps no lock object and another job's lock is never
  removed; a job that stopped (or a store that refuses the conditional delete) writes it back
  marked released (``If-Match``).

A driver killed on another host frees the lock when its lease runs out (``LEASE_SECONDS``); one
killed on this host frees it at once. The record names the holder, which a refused job quotes.
"""
from __future__ import annotations

import email.utils
import json
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any

from storage.locations import redacted, s3_client

from .lock import LOCK_FILE, describe_holder, holder_record
from .errors import OutputDirError

LEASE_SECONDS = 120.0


class StoreLock:
    """``with StoreLock(out):`` holds the store OUTPUT_DIR ``out`` for the block (see the module)."""

    def __init__(self, out: Any, lease: float = LEASE_SECONDS) -> None:
        self.out, self.lease, self.key = out, lease, out.key(LOCK_FILE)
        self.etag: str | None = None
        self.lost = False
        self.since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, released: bool = False, **condition: str) -> str | None:
        """Write the holder record under ``condition``; its new ETag, or None if the condition failed."""
        from botocore.exceptions import BotoCoreError, ClientError
        body = json.dumps(holder_record(self.since, released=released, lease_seconds=self.lease)).encode()
        try:
            return s3_client().put_object(Bucket=self.out.bucket, Key=self.key, Body=body, **condition)["ETag"]
        except (ClientError, BotoCoreError) as e:
            if isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") in ("PreconditionFailed",
                                                                                          "ConditionalRequestConflict"):
                return None
            raise OutputDirError(f"{self.out.where(LOCK_FILE)}: {redacted(e)}") from None

    def __enter__(self) -> "StoreLock":
        self.etag = self._put(IfNoneMatch="*")
        if self.etag is None:
            holder, etag, age = self._current()
            if not _free(holder, age):
                raise self._in_use(holder, age)
            self.etag = self._put(IfMatch=etag)
            if self.etag is None:
                raise OutputDirError(f"{self.out}: another elmo embed job took its lock at the same moment; "
                                     f"one job at a time per output")
        self._thread = threading.Thread(target=self._renew, name="elmo-lease", daemon=True)
        self._thread.start()
        return self

    def _in_use(self, holder: dict, age: float) -> OutputDirError:
        return OutputDirError(
            f"{self.out} is in use by another elmo embed job ({describe_holder(holder)}; lease renewed {age:.0f} s "
            f"ago); one job at a time per output: wait for it to finish or stop it (a stopped job releases "
            f"the lock; a killed one on another host after its {holder.get('lease_seconds', self.lease):.0f} s "
            f"lease), then rerun with --resume")

    def check_free(self) -> None:
        """OutputDirError naming the holder where a running job holds the lease; writes nothing."""
        if self.out.size(LOCK_FILE) is None:
            return
        holder, _, age = self._current()
        if not _free(holder, age):
            raise self._in_use(holder, age)

    def _current(self) -> tuple[dict, str, float]:
        """(the holder's record, its ETag, seconds since it was written by the store's clock)."""
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            got = s3_client().get_object(Bucket=self.out.bucket, Key=self.key)
        except (ClientError, BotoCoreError) as e:
            raise OutputDirError(f"{self.out.where(LOCK_FILE)}: {redacted(e)}") from None
        try:
            holder = json.loads(got["Body"].read())
        except ValueError:
            holder = {}
        date = got["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        now = email.utils.parsedate_to_datetime(date) if date else datetime.now(timezone.utc)
        return holder if isinstance(holder, dict) else {}, got["ETag"], (now - got["LastModified"]).total_seconds()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 4):
            try:
                etag = self._put(IfMatch=self.etag)
            except OutputDirError:
                continue  # the store did not answer: try again; the lease outlasts a few misses
            if etag is None:
                self.lost = True
                return
            self.etag = etag

    def finished(self) -> None:
        """The job is done: stop renewing, then delete the lock object if it is still the version
        this job wrote; where the store refuses (another job took it, or it has no conditional
        delete), ``__exit__`` marks it released instead."""
        self._stop_renewing()
        if self.etag is None or self.lost:
            return
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            s3_client().delete_object(Bucket=self.out.bucket, Key=self.key, IfMatch=self.etag)
        except (ClientError, BotoCoreError):
            return
        self.etag = None

    def check(self) -> None:
        """Raise if another job took the lock after this one's lease ran out."""
        if self.lost:
            raise OutputDirError(f"{self.out}: this job lost its lock (its lease of {self.lease:.0f} s ran out without "
                                 f"renewal and another job took it); its shards are kept: rerun with --resume")

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __exit__(self, *exc: object) -> None:
        self._stop_renewing()
        if self.etag is not None and not self.lost:
            try:  # released: the next job takes it at once; if another took it meanwhile, it stays theirs
                self._put(released=True, IfMatch=self.etag)
            except OutputDirError as e:  # not released: its lease runs out by itself
                print(f"warning: the lock was not released ({e}); it frees itself in {self.lease:.0f} s",
                      file=sys.stderr)
        self.etag = None


def _free(holder: dict, age: float) -> bool:
    if holder.get("released") or age > float(holder.get("lease_seconds", LEASE_SECONDS)):
        return True
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True  # its holder died on this host
        except PermissionError:
            return False
    return False

