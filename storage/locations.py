"""Where files live: local paths, or URIs of object stores and remote file systems (``s3://``,
``gs://``, ``hdfs://``, ``file://``), through one layer over ``pyarrow.fs``.

Credentials and endpoints come the way the ecosystem passes them: the standard AWS environment
variables and config files (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``AWS_REGION``), and ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for S3-compatible stores
(MinIO, Ceph, a local test server). Nothing here prints them.

``open_input``, ``file_info``, ``list_files`` and ``dataset_source`` read a file wherever it lives
(``elmo embed``'s INPUT). ``local_copy(uri)`` fetches a remote directory (a model) once per machine into
``cache_root()/remote/``, keyed by what the store reports for each file (its size and modification
time, or ETag where given); a reader sees a whole copy or none. ``s3_client`` is the one S3 client
of a process (boto3, the ``s3`` extra), for what pyarrow cannot do: conditional writes; it counts
its requests (``S3_REQUESTS``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from .atomic import atomic_dir
from elmo_core.errors import InputError

URI_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "file")
# Where an S3-compatible store is (not who may use it): read here, passed on to Ray's workers.
LOCATION_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")
HIDDEN_PREFIXES = (".", "_")  # names readers skip (and what is below them): temporaries, manifests, locks


def cache_root() -> Path:
    """The directory every cache of this package lives under: ``$ELMO_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/elmo-pipeline``, else ``~/.cache/elmo-pipeline``. Removing it only costs work."""
    if os.environ.get("ELMO_CACHE_DIR"):
        return Path(os.environ["ELMO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "elmo-pipeline"


def is_uri(spec: str | Path) -> bool:
    """True for ``scheme://...`` of a store or remote file system (a local path is not one)."""
    return isinstance(spec, str) and urlparse(spec).scheme in URI_SCHEMES and "://" in spec


def normalize_uri(uri: str) -> str:
    """``scheme://bucket/key`` with its key's empty and ``.`` segments dropped and ``..`` applied,
    no trailing '/': the one spelling of a location, so that every command names the same objects
    (``s3://b//x/`` and ``s3://b/y/../x`` are ``s3://b/x``). InputError for a ``..`` above the bucket."""
    parsed = urlparse(uri)
    parts: list[str] = []
    for part in parsed.path.split("/"):
        if part == "..":
            if not parts:
                raise InputError(f"{uri}: '..' goes above the bucket {parsed.netloc}; name the prefix itself")
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return f"{parsed.scheme}://{parsed.netloc}" + "".join(f"/{p}" for p in parts)


def is_below(path: str | Path, directory: str | Path) -> bool:
    """Whether ``path`` is ``directory`` or lies below it: local paths resolved (links followed),
    URIs normalized (``normalize_uri``)."""
    if is_uri(path) != is_uri(directory):
        return False
    if is_uri(path):
        a, b = normalize_uri(str(path)), normalize_uri(str(directory))
        return a == b or a.startswith(b + "/")
    return Path(path).resolve().is_relative_to(Path(directory).resolve())


def is_hidden(relative: str) -> bool:
    """Whether a path below a corpus or output directory is skipped by readers (a part starts with
    ``.`` or ``_``)."""
    return any(part.startswith(HIDDEN_PREFIXES) for part in Path(relative).parts)


def _s3_endpoint_and_region() -> tuple[str | None, str]:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return endpoint, os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def filesystem(uri: str):  # type: ignore[no-untyped-def]
    """(pyarrow FileSystem, path within it) of a URI; an S3 endpoint from ``AWS_ENDPOINT_URL`` (one
    FileSystem, and its connections, per endpoint in a process)."""
    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    endpoint, region = _s3_endpoint_and_region()
    try:
        if parsed.scheme == "s3" and endpoint:
            return _s3_at(endpoint, region), f"{parsed.netloc}{parsed.path}".rstrip("/")
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    except (OSError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) or OSError
        raise InputError(f"{uri}: cannot open this location ({redacted(e)})") from None


@functools.lru_cache(maxsize=16)
def _s3_at(endpoint: str, region: str):  # type: ignore[no-untyped-def]
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(endpoint_override=endpoint, scheme=urlparse(endpoint).scheme or "https", region=region)


S3_REQUESTS = {"count": 0}  # requests sent by s3_client's clients in this process (benchmarks report them)


def s3_location(uri: str) -> tuple[str, str]:
    """(bucket, key prefix without a trailing '/') of ``s3://bucket/prefix``."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise InputError(f"{uri}: not an s3://bucket/prefix URI")
    return parsed.netloc, parsed.path.strip("/")


def s3_client():  # type: ignore[no-untyped-def]
    """The process's boto3 S3 client for the endpoint and region of the environment (credentials:
    boto3's standard chain)."""
    return _s3_client_at(*_s3_endpoint_and_region())


@functools.lru_cache(maxsize=16)
def _s3_client_at(endpoint: str | None, region: str):  # type: ignore[no-untyped-def]
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise InputError("writing to s3:// needs boto3 (its conditional writes): pip install -e '.[s3]'") from None
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region,
                                            config=Config(retries={"max_attempts": 5, "mode": "standard"}))

    def count(**_: object) -> None:
        S3_REQUESTS["count"] += 1

    client.meta.events.register("before-send.s3", count)
    return client


def open_input(spec: str | Path):  # type: ignore[no-untyped-def]
    """A random-access binary reader (seek, read; pyarrow takes it) of a local path or a URI."""
    if not is_uri(spec):
        return open(spec, "rb")
    fs, path = filesystem(str(spec))
    try:
        return fs.open_input_file(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{spec}: cannot open it ({redacted(e)})") from None


def file_info(spec: str | Path) -> tuple[int, int] | None:
    """(bytes, modification time in ns) of a file at a path or URI; None where there is no file."""
    import pyarrow.fs as pafs

    fs, path = filesystem(str(spec)) if is_uri(spec) else (pafs.LocalFileSystem(), os.path.abspath(spec))
    info = fs.get_file_info(path)
    return (info.size, info.mtime_ns or 0) if info.type == pafs.FileType.File else None


def file_etag(spec: str | Path) -> str | None:
    """The ETag an S3 store gives the object's current version (any rewrite changes it); None for
    other locations, or where boto3 (the ``s3`` extra) is not installed."""
    if not str(spec).startswith("s3://"):
        return None
    try:
        client = s3_client()
    except InputError:
        return None
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = s3_location(str(spec))
    try:
        return client.head_object(Bucket=bucket, Key=key)["ETag"]
    except (BotoCoreError, ClientError) as e:  # gone or unreadable: what a changed input is too
        raise InputError(f"{spec}: cannot read its version from the store ({redacted(e)})") from None


def list_files(uri: str, suffixes: tuple[str, ...]) -> list[str]:
    """The URI itself if it is a file; else the files below it with one of ``suffixes``, names
    starting with ``.`` or ``_`` (and what is below them) skipped, as URIs in sorted order."""
    import pyarrow.fs as pafs

    fs, base = filesystem(uri)
    scheme = urlparse(uri).scheme
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.File:
        return [uri]
    if info.type != pafs.FileType.Directory:
        raise InputError(f"{uri}: no such file or directory on the store")
    found = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
             if i.is_file and i.path.endswith(suffixes) and not is_hidden(i.path[len(base):].lstrip("/"))]
    if not found:
        raise InputError(f"{uri}: no files ending in {', '.join(suffixes)} there")
    return sorted(f"{scheme}://{p}" for p in found)


def dataset_source(spec: str | Path) -> tuple[str, object | None]:
    """(path, filesystem) for ``pyarrow.dataset.dataset(path, filesystem=...)``: None for a local path."""
    if not is_uri(spec):
        return str(spec), None
    fs, path = filesystem(str(spec))
    return path, fs


def redacted(error: BaseException) -> str:
    """An error's text without anything that looks like a credential."""
    text = str(error)[:300]
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        if secret := os.environ.get(name):
            text = text.replace(secret, "***")
    return text


def local_copy(uri: str, root: Path | None = None) -> Path:
    """A remote directory's files (not its subdirectories) in a local directory, fetched once per
    machine and reused while the store reports the same files; its path."""
    import pyarrow.fs as pafs

    fs, base = filesystem(uri)
    try:
        infos = [i for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)) if i.is_file]
    except (OSError, ValueError) as e:
        raise InputError(f"{uri}: cannot list this directory ({redacted(e)})") from None
    if not infos:
        raise InputError(f"{uri}: no files there (a model directory on the store holds options.json and its "
                         f"weights; check the bucket and prefix)")
    listing = sorted((i.base_name, i.size, str(i.mtime_ns)) for i in infos)
    key = hashlib.sha256(json.dumps([uri, listing]).encode()).hexdigest()[:20]
    target = (root or cache_root()) / "remote" / key
    if (target / ".complete").is_file():
        return target
    try:
        with atomic_dir(target, ".complete") as tmp:
            for info in infos:
                with fs.open_input_stream(info.path) as src, open(tmp / info.base_name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            (tmp / ".complete").write_text(json.dumps({"uri": uri, "files": listing}))
    except OSError as e:
        raise InputError(f"{uri}: fetching it into {target} failed ({redacted(e)})") from None
    return target


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, at a local path or a URI: read a MiB at a time into one buffer (a
    file another process may truncate meanwhile, a model's weights, an input: no mapping, whose
    pages would fault, and count in the process's resident memory, for the whole file)."""
    h, buffer = hashlib.sha256(), bytearray(1 << 20)
    with open_input(path) as f:
        if is_uri(path):
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest()
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            h.update(view[:n])
    return h.hexdigest()


_MAP_BYTES = 16 << 20  # the most of a file mapped at once (resident while it is hashed)


class GrowingFileDigest:
    """The sha256 of a local file that its writer writes front to back and never rewrites (a shard's
    temporary, as pyarrow writes Parquet and Arrow IPC files; nothing else writes it), hashed as it
    grows: ``advance()`` hashes the bytes added since the last call, read in place from the page
    cache (``mmap``, at most ``_MAP_BYTES`` mapped at once: no copy, the GIL released), so the
    digest is ready when the last byte is written instead of costing a second pass over the file at
    its commit. What it hashes is what the file holds, as a re-read would."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.hash, self.hashed = Path(path), hashlib.sha256(), 0

    def advance(self) -> None:
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            try:
                while self.hashed < size:
                    start = self.hashed - self.hashed % mmap.ALLOCATIONGRANULARITY
                    length = min(size, start + _MAP_BYTES) - start
                    with mmap.mmap(f.fileno(), length, offset=start, access=mmap.ACCESS_READ) as m, \
                            memoryview(m) as view:
                        self.hash.update(view[self.hashed - start :])
                    self.hashed = start + length
            except OSError:  # a file system that cannot map files (some FUSE mounts): read them
                f.seek(self.hashed)
                for chunk in iter(lambda: f.read(min(1 << 20, size - f.tell())), b""):
                    self.hash.update(chunk)
                self.hashed = size

    def hexdigest(self) -> str:
        return self.hash.hexdigest()
