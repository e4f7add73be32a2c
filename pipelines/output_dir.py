"""Where an ``elmo embed`` job writes: OUTPUT_DIR on a local (or shared) file system, or a prefix of
an object store (``s3://bucket/prefix``). One interface over both, so that the commit protocol
(``pipelines.sink``), ``--resume`` and ``elmo verify`` are written once.

Names are relative to OUTPUT_DIR (``part-00000-00000.parquet``, ``_shards/part-00000-00000.parquet``).
What differs is how a shard's bytes become visible under their name:

- local: written to ``.NAME.HOST.PID.wRANDOM.tmp`` (each writer its own: ``storage.atomic``), fsynced,
  then linked under its name only if no file has it yet (``os.link``, atomic and exclusive), like the
  store's conditional completion below;
- store: streamed as a multipart upload, which the store shows whole or not at all when it is
  completed; the completion is conditional (``If-None-Match: *``), so an object, once there, is
  never replaced: a late writer of a dead attempt cannot overwrite a committed shard. Its commit
  record follows it and carries the object's ETag, which changes whenever an object is rewritten,
  so ``--resume`` checks a shard with one HEAD; ``elmo verify`` still reads every byte.

Either way the first writer of a shard wins and a later one (a retried or speculative task of the
same job) gets ``ShardPublishedError``; the commit protocol then adopts the published shard if its
footer says it is this job's rows (``pipelines.sink``).

``open_output(spec)`` gives the one for a path or a URI; only ``s3://`` can be written (the lock
and the commit need conditional writes, see ``pipelines.store_lock``).
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from corpora.files import check_name
from storage.atomic import TMP_GLOB, atomic_path, check_can_make_in, fsync, nearest_existing, parse_json_object, \
    temporary_name
from elmo_core.errors import InputError
from storage.locations import GrowingFileDigest, file_sha256, is_uri, normalize_uri, open_input, redacted, \
    s3_client, s3_location

from .lock import OutputLock
from .errors import OutputDirError, ShardPublishedError
from .shard_files import shard_format


def open_output(spec: str | Path) -> "LocalDir | StoreDir":
    if not is_uri(spec):
        check_name(spec)  # pyarrow writes UTF-8 names only: refused before anything is written
        return LocalDir(Path(spec))
    if str(spec).startswith("file://"):
        check_name(str(spec)[len("file://"):])
        return LocalDir(Path(str(spec)[len("file://"):]))
    if not str(spec).startswith("s3://"):
        raise OutputDirError(f"OUTPUT_DIR {spec}: elmo embed writes to a local or shared file system or to s3:// "
                             f"(its commit needs conditional writes); write to one of those")
    return StoreDir(normalize_uri(str(spec)))


class _Readable:
    """What both outputs read the same way: through ``storage.locations``, by ``where(name)``; each
    gives ``where``, ``read_bytes`` and ``write_bytes``."""

    def sha256(self, name: str) -> str:
        try:
            return file_sha256(self.where(name))
        except OSError as e:
            raise OutputDirError(f"{self.where(name)}: {redacted(e)}") from None

    def open_read(self, name: str) -> Any:
        """A random-access reader of ``name`` (InputError where it cannot be opened)."""
        return open_input(self.where(name))

    def read_table(self, name: str, columns: list[str]) -> pa.Table:
        """Shard ``name``'s ``columns`` (its format read from its name: ``shard_files``)."""
        with self.open_read(name) as f:
            return shard_format(name).read_table(f, columns)

    def read_record(self, name: str) -> dict:
        """The side record in ``name`` (``pipelines.sink``; its format read from its name, a JSON
        file of an earlier elmo embed too): FileNotFoundError where there is none, InputError where
        the file holds no record."""
        data = self.read_bytes(name)
        if name.endswith(".json"):
            try:
                return parse_json_object(data.decode("utf-8"), self.where(name))
            except UnicodeDecodeError as e:
                raise InputError(f"{self.where(name)}: cannot be read as JSON ({e})") from None
        try:
            record = shard_format(name).read_record(data)
        except (pa.ArrowException, OSError):
            record = None
        if record is None:
            raise InputError(f"{self.where(name)}: holds no record of elmo embed (elmo.record)")
        return record

    def read_schema(self, name: str) -> pa.Schema:
        """The schema side record ``name`` was written with: the job's, its shards'."""
        return shard_format(name).schema(pa.BufferReader(self.read_bytes(name)))

    def write_record(self, name: str, record: dict, schema: pa.Schema) -> None:
        """``record`` as a side file of the format ``name`` ends in, in the job's ``schema`` with no
        rows (``shard_files``), whole or not at all."""
        self.write_bytes(name, shard_format(name).record_bytes(schema, record))


class LocalDir(_Readable):
    """OUTPUT_DIR on a file system: temporary file, fsync, rename; a ``flock`` lock."""

    is_store = False

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    def where(self, name: str) -> str:
        return str(self.root / name)

    def prepare(self) -> None:
        """OutputDirError, before the model loads, for a path that cannot become OUTPUT_DIR: a file,
        or a new directory below a file or below one this process may not write in."""
        if self.root.exists() and not self.root.is_dir():
            raise OutputDirError(f"{self.root}: exists and is not a directory; OUTPUT_DIR must be a directory "
                                 f"(new or empty)")
        if self.root.exists():
            return
        above = nearest_existing(self.root)  # not the root itself: it does not exist
        if not above.is_dir():
            raise OutputDirError(f"{self.root}: {above} is a file, so no directory can be made below it; choose "
                                 f"another OUTPUT_DIR")
        try:
            check_can_make_in(above, self.root.name)
        except OSError as e:
            raise OutputDirError(f"{self.root}: {above} cannot be written ({e.strerror}), so OUTPUT_DIR cannot be "
                                 f"made there; choose another OUTPUT_DIR") from None

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def exists(self) -> bool:
        return self.root.is_dir()

    def lock(self) -> OutputLock:
        return OutputLock.for_dir(self.root)

    def entries(self) -> dict[str, bool]:
        """Top-level names -> whether each is a directory."""
        return {p.name: p.is_dir() for p in self.root.iterdir()} if self.root.is_dir() else {}

    def commit_names(self, folder: str) -> list[str]:
        """The records in ``folder`` (not its temporaries)."""
        folder_path = self.root / folder
        names = os.listdir(folder_path) if folder_path.is_dir() else []
        return sorted(f"{folder}/{n}" for n in names if not n.startswith("."))

    def size(self, name: str) -> int | None:
        path = self.root / name
        return path.stat().st_size if path.is_file() else None

    def read_bytes(self, name: str) -> bytes:
        """The file's bytes; FileNotFoundError where there is none."""
        return (self.root / name).read_bytes()

    def write_bytes(self, name: str, data: bytes) -> None:
        """Whole or not at all (``storage.atomic``)."""
        folder = (self.root / name).parent
        if folder.exists() and not folder.is_dir():  # a record's folder (_shards) made a file by someone
            raise OutputDirError(f"{folder}: a file where this job keeps its records (a directory); move it out of "
                                 f"OUTPUT_DIR, then rerun with --resume")
        folder.mkdir(exist_ok=True)
        with atomic_path(self.root / name, tidied=True) as tmp:  # the job removes OUTPUT_DIR's (``remove_temporaries``)
            tmp.write_bytes(data)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def unchanged(self, name: str, record: dict) -> bool:
        """Whether the file holds what ``record`` committed (every byte read)."""
        return self.size(name) == record.get("bytes") and self.sha256(name) == record.get("sha256")

    def shard_sink(self, name: str) -> "LocalSink":
        return LocalSink(self.root, name)

    def remove_temporaries(self, folders: tuple[str, ...]) -> list[str]:
        found = [p for d in ("", *folders) if (self.root / d).is_dir() for p in (self.root / d).glob(TMP_GLOB)]
        for p in found:
            p.unlink(missing_ok=True)
        return sorted(str(p.relative_to(self.root)) for p in found)


class LocalSink:
    """A shard's bytes in a temporary file of this writer's own, hashed as they are written
    (``written``, after each of the writer's tables); ``finish`` makes them durable and links them
    under the shard's name unless another writer did first; ``publish`` drops the temporary name."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.final = root, root / name
        self.tmp = temporary_name(self.final, f"w{secrets.token_hex(4)}")  # its own: attempts may overlap; the job tidies
        self.file: Any = self.tmp
        self.digest = GrowingFileDigest(self.tmp)

    def written(self) -> None:
        """Hash what the writer has added to the file so far (``storage.locations.GrowingFileDigest``)."""
        self.digest.advance()

    def finish(self) -> dict:
        fsync(self.tmp)
        self.digest.advance()  # the footer, and anything a writer's buffer held
        record = {"sha256": self.digest.hexdigest(), "bytes": self.digest.hashed}
        try:
            os.link(self.tmp, self.final)  # atomic, and refused where the name exists
        except FileExistsError:
            self.abort()
            raise ShardPublishedError(f"{self.final}: another writer published it first") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            os.replace(self.tmp, self.final)  # a file system without hard links: the last writer wins
        fsync(self.root)
        return record

    def abort(self) -> None:
        self.tmp.unlink(missing_ok=True)

    publish = abort  # the shard's name holds the bytes: the temporary name goes


class StoreDir(_Readable):
    """OUTPUT_DIR on S3 (or an S3-compatible store with conditional writes): conditional multipart
    uploads, a lease lock (``pipelines.store_lock``)."""

    is_store = True

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.bucket, self.prefix = s3_location(uri)

    def __str__(self) -> str:
        return self.uri

    def __reduce__(self) -> tuple:  # Ray workers get the URI; each process makes its own client
        return StoreDir, (self.uri,)

    def where(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def prepare(self) -> None:
        """Check that the bucket is there and ours to use, before anything is computed."""
        with self._errors(""):
            s3_client().head_bucket(Bucket=self.bucket)

    def create(self) -> None:
        """Nothing to create: a prefix exists once an object is under it."""

    def exists(self) -> bool:
        return bool(self.entries())

    def lock(self) -> Any:
        from .store_lock import StoreLock
        return StoreLock(self)

    def entries(self, folder: str = "") -> dict[str, bool]:
        """The names directly under ``folder`` (top-level: "") -> whether each is a "directory"."""
        found: dict[str, bool] = {}
        start = self.key(f"{folder}/" if folder else "")
        with self._errors(folder):
            for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start,
                                                                              Delimiter="/"):
                found.update({o["Key"][len(start):]: False for o in page.get("Contents", [])})
                found.update({p["Prefix"][len(start):].rstrip("/"): True for p in page.get("CommonPrefixes", [])})
        return found

    def commit_names(self, folder: str) -> list[str]:
        names = self.entries(folder)  # a record's name has no "/": deeper keys list as "directories"
        return sorted(f"{folder}/{n}" for n, is_dir in names.items() if not is_dir and not n.startswith("."))

    def head(self, name: str) -> dict | None:
        from botocore.exceptions import ClientError
        try:
            return s3_client().head_object(Bucket=self.bucket, Key=self.key(name))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise OutputDirError(f"{self.where(name)}: {redacted(e)}") from None

    def size(self, name: str) -> int | None:
        head = self.head(name)
        return None if head is None else int(head["ContentLength"])

    def read_bytes(self, name: str) -> bytes:
        """The object's bytes; FileNotFoundError where there is none."""
        from botocore.exceptions import ClientError
        try:
            return s3_client().get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise FileNotFoundError(self.where(name)) from None
            raise OutputDirError(f"{self.where(name)}: {redacted(e)}") from None

    def write_bytes(self, name: str, data: bytes) -> None:
        with self._errors(name):  # one PUT: the object is the old one or the whole new one
            s3_client().put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def delete(self, name: str) -> None:
        with self._errors(name):
            s3_client().delete_object(Bucket=self.bucket, Key=self.key(name))

    def unchanged(self, name: str, record: dict) -> bool:
        """Whether the object is the one ``record`` committed: its size and ETag (a rewrite changes it)."""
        head = self.head(name)
        return head is not None and head["ContentLength"] == record.get("bytes") and head["ETag"] == record.get("etag")

    def shard_sink(self, name: str) -> Any:
        from .store_upload import StoreUpload
        return StoreUpload(self, name)

    def remove_temporaries(self, folders: tuple[str, ...]) -> list[str]:
        """Abort the multipart uploads under OUTPUT_DIR that never completed (writers that died)."""
        client, found = s3_client(), []
        with self._errors(""):
            for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                Prefix=self.key("")):
                for u in page.get("Uploads", []):
                    client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"])
                    found.append(u["Key"][len(self.key("")):] + " (upload)")
        return sorted(found)

    @contextlib.contextmanager
    def _errors(self, name: str) -> Iterator[None]:
        """A store's error as an OutputDirError naming the object (credentials never in it)."""
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            yield
        except (ClientError, BotoCoreError) as e:
            code = e.response.get("Error", {}).get("Code") if isinstance(e, ClientError) else None
            hint = {"404": f"no bucket {self.bucket} on this store (create it first)", "NoSuchBucket":
                    f"no bucket {self.bucket} on this store (create it first)",
                    "403": "access denied: check the credentials (AWS_* variables, AWS_PROFILE) and their permissions",
                    "AccessDenied": "access denied: check the credentials and their permissions"}.get(code or "")
            raise OutputDirError(f"{self.where(name).rstrip('/')}: {hint or redacted(e)}") from None

