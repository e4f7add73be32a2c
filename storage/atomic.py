"""The one way this project writes a file: whole or not at all.

``atomic_path(path)`` gives a temporary name beside ``path`` (``.NAME.HOST.PID.tmp``: hidden from
readers, unique to the writing process, so two writers never share one); when the block ends
without an error the file is fsynced, renamed over ``path`` and its directory fsynced, so after a
crash ``path`` holds either its old content or the whole new one. On an error the temporary file
is removed. ``atomic_dir(path, complete)`` does the same for a directory built once and shared by
processes (a cache entry): of several builders, the first rename wins and the others keep it.
A temporary name is created exclusively, never through a link.

A writer killed outright (SIGKILL, out of memory, power lost) cannot remove its temporary, so every
writer first removes those of its path that dead writers left (``new_temporary``). The rule, safe
for writers that share a directory (Ray or Spark workers of one machine, commands sharing a model
cache, a file system mounted by several hosts): a temporary is removed only where its name carries
this host and a pid that no process here has (``os.kill(pid, 0)`` finds none; a process of another
user counts as alive). HOST is the host name with every character but ASCII letters, digits and '-'
written ``_XX`` (its UTF-8 bytes), so it holds no dot and names parse one way; a process in a pid
namespace other than the host's (a container sharing the host's name) adds ``+N``, the namespace's
inode, as its pids are not the host's. Another host's temporary is left: its writer may be alive.
A pid reused since its writer died keeps the temporary until that process exits. The cost: one
listing of the path's directory per write (about 5 ms with 10,000 names in it, less than a small
file's fsyncs), none where the caller removes the directory's temporaries itself (an ``elmo embed``
job's shards and records: it does under its lock on a resume and after a failure).
``remove_stale_temporaries`` removes every writer's, for a caller that holds the path's lock (no
writer of it is alive); it also takes the ``.NAME.PID.tmp`` of earlier versions, which name no
host. Cleaners of a whole directory recognise temporaries by the ``.*.tmp`` pattern (``TMP_GLOB``).
``read_json_object`` is the one way it reads back the JSON records it writes.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from elmo_core.errors import InputError

TMP_GLOB = ".*.tmp"
_TAG = re.compile(r"[a-z][a-z0-9]*")  # a second temporary's: never a pid, so a name parses one way
_HOST_PID_NAMESPACE = 0xEFFFFFFC  # the kernel's own (PROC_PID_INIT_INO)


def fsync(path: str | Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, tidied: bool = False) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write ``tmp``; it becomes ``p`` when the block succeeds.
    ``tidied``: the caller removes its directory's temporaries itself, under its lock (an embed
    job's OUTPUT_DIR): no listing of the directory a write (``new_temporary``)."""
    path = Path(path)
    make_parent(path, directory=False)
    tmp = temporary_name(path) if tidied else new_temporary(path)
    tmp.unlink(missing_ok=True)  # a leftover of an earlier process with this pid, or a planted link: never followed
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
        yield tmp
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


class WriteGuard:
    """A file opened for a writer that must never meet an I/O error (libhdf5: after a failed write,
    its error path crashes the process): a failed write or resize (a full disk) is recorded and
    reported done, and ``check()`` raises the recorded OSError. The caller drops the file whole
    after that error (``atomic_path`` removes it). Pass it as the file object (``h5py.File(guard, "w")``)."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.error = Path(path), None
        self.file = open(path, "w+b", buffering=0)  # unbuffered: every error comes from its own write

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        try:
            done = 0
            while self.error is None and done < len(view):
                done += self.file.write(view[done:])
        except OSError as e:
            self.error = self.error or e
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        try:
            return self.file.truncate(size)
        except OSError as e:
            self.error = self.error or e
            return size if size is not None else self.file.tell()

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def readinto(self, buffer: Any) -> int | None:
        return self.file.readinto(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def flush(self) -> None:
        """Nothing buffered here (the file is unbuffered)."""

    def check(self) -> None:
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror, str(self.path))

    def close(self) -> None:
        self.file.close()


def writer_host() -> str:
    """This process's host as its temporaries' names carry it (the module's rule)."""
    name = host_tag(socket.gethostname())
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no /proc (macOS): a host has one pid namespace
        return name
    return name if namespace == _HOST_PID_NAMESPACE else f"{name}+{namespace}"


def host_tag(hostname: str) -> str:
    """``hostname`` as a temporary's name carries it: each character but an ASCII letter, digit or
    '-' written ``_XX`` (its UTF-8 bytes in hex), so it holds no dot and two names are never written alike."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "-")
                   else "".join(f"_{b:02x}" for b in c.encode("utf-8", "surrogateescape")) for c in hostname) or "_"


def temporary_name(path: str | Path, tag: str = "", *, host: str | None = None, pid: int | None = None) -> Path:
    """``.NAME.HOST.PID.tmp`` beside ``path``: this process's temporary of ``path`` (``host``'s ``pid``'s
    where given); ``tag`` (a lowercase letter, then lowercase letters or digits) names another one of
    the same writer: ``.NAME.HOST.PID.TAG.tmp``."""
    if tag and not _TAG.fullmatch(tag):
        raise ValueError(f"a temporary's tag is a lowercase letter, then lowercase letters or digits: {tag!r}")
    path = Path(path)
    writer = [host or writer_host(), str(os.getpid() if pid is None else pid), *([tag] if tag else [])]
    return path.with_name(f".{path.name}.{'.'.join(writer)}.tmp")


def new_temporary(path: str | Path, tag: str = "") -> Path:
    """This process's temporary name for ``path`` (not made), once the temporaries of ``path`` that
    writers which died on this host left are removed: how every writer starts (the module's rule)."""
    host, me = writer_host(), os.getpid()
    for tmp, (writer_at, pid) in _temporaries(Path(path)):
        if writer_at == host and pid != me and not _alive(pid):
            _remove(tmp)
    return temporary_name(path, tag)


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete every temporary of ``path`` but this process's own, whatever its host or pid (and the
    ``.NAME.PID.tmp`` of earlier versions): for a caller that holds ``path``'s lock, so that no live
    writer owns one. Returns what it removed."""
    host, me = writer_host(), os.getpid()
    return [tmp for tmp, (writer_at, pid) in _temporaries(Path(path))
            if not (pid == me and writer_at in (host, None)) and _remove(tmp)]


def _temporaries(path: Path) -> list[tuple[Path, tuple[str | None, int]]]:
    """The temporaries of ``path`` beside it, each with its writer: (host, or None where the name of
    an earlier version has none; pid). Names of other paths never parse as these (HOST has no dot,
    a TAG is never a pid)."""
    prefix = f".{path.name}."
    names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    found = [(path.parent / n, _writer(n[len(prefix):-4].split("."))) for n in names if len(n) > len(prefix) + 4]
    return [(tmp, writer) for tmp, writer in found if writer is not None]


def _writer(parts: list[str]) -> tuple[str | None, int] | None:
    """(host, pid) of a temporary from the parts between its path's name and ``.tmp``: HOST.PID[.TAG],
    or an earlier version's PID[.TAG]; None for a name of another form."""
    if _is_pid(parts[0]) and (len(parts) == 1 or len(parts) == 2 and _TAG.fullmatch(parts[1])):
        return None, int(parts[0])
    if len(parts) in (2, 3) and parts[0] and _is_pid(parts[1]) and all(_TAG.fullmatch(t) for t in parts[2:]):
        return parts[0], int(parts[1])
    return None


def _is_pid(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _alive(pid: int) -> bool:
    """Whether this host has a process ``pid`` (one exited but not yet reaped still holds its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; a number no pid can be: not judged
        return True
    return True


def _remove(tmp: Path) -> bool:
    """Delete a dead writer's temporary (a directory whole, a link itself); False where it is gone
    already (another writer removed it) or cannot be (another user's in a sticky directory: left)."""
    try:
        if stat.S_ISDIR(os.lstat(tmp).st_mode):
            shutil.rmtree(tmp)
        else:
            tmp.unlink()
    except (FileNotFoundError, PermissionError):
        return False
    return True


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself or the nearest directory above it that exists (``/`` does): where making it
    would start, or a file that stands in its way."""
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


def make_parent(path: Path, directory: bool) -> None:
    """The folders above ``path``, made where missing; InputError where a file stands in their way or
    where ``path`` is of the other kind (a folder where a file is written: ``directory`` False)."""
    above = nearest_existing(path.parent)
    if not above.is_dir():
        raise InputError(f"{path}: {above} is a file, not a directory; give a path whose folders are folders")
    if path.is_dir() != directory and path.exists():
        raise InputError(f"{path}: is {'a file' if directory else 'a directory'}; give "
                         f"{'a directory' if directory else 'a file name'} (new, or one written here before)")
    path.parent.mkdir(parents=True, exist_ok=True)


def check_can_make_in(directory: Path, name: str) -> None:
    """OSError (the system's: read-only, permission, not a directory) where no directory can be
    made in ``directory``: a hidden probe ``.NAME.HOST.PID.probe.tmp`` made and removed, as a real write
    would be judged (``os.access`` reads the real uid and misses read-only mounts)."""
    probe = temporary_name(directory / name, "probe")
    probe.mkdir()
    probe.rmdir()


def check_can_publish(path: str | Path) -> None:
    """OSError where ``atomic_dir(path)`` could not make its temporary directory beside ``path`` (InputError
    where a file stands where a folder above it would be: ``make_parent``):
    asked before a long run whose result is published there, not after it. The directories above
    ``path`` are made as ``atomic_dir`` makes them."""
    make_parent(Path(path), directory=True)
    check_can_make_in(Path(path).parent, Path(path).name)


@contextmanager
def atomic_dir(path: str | Path, complete: str, replace: bool = False) -> Iterator[Path]:
    """``with atomic_dir(d, "manifest.json") as tmp:`` fill the new directory ``tmp``; it becomes
    ``d`` when the block succeeds. If another process published ``d`` meanwhile (its ``complete``
    file is there), theirs is kept and this one dropped; with ``replace`` an existing ``d`` is
    moved aside and removed instead (readers see the old directory or the new one, never a mix).
    On an error ``tmp`` is removed and ``d`` is as it was."""
    path = Path(path)
    make_parent(path, directory=True)
    tmp, old = new_temporary(path), temporary_name(path, "old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if replace and path.exists():
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except OSError:
                os.rename(old, path)
                raise
        else:
            try:
                os.rename(tmp, path)
            except OSError:
                if not (path / complete).is_file():  # not another process's finished copy: a real failure
                    raise
        fsync(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def digest(obj: Any) -> str:
    """sha256 of a JSON-able object in canonical form (sorted keys, no spaces): a record's identity
    (an embed job's, an export manifest's own contents)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: Any, **dumps: Any) -> None:
    """``obj`` as JSON, whole or not at all: how the project writes a JSON record (``dumps``:
    json.dumps's options; default indent 2, sorted keys), one line ending."""
    write_text_atomic(path, json.dumps(obj, **({"indent": 2, "sort_keys": True} | dumps)) + "\n")


def read_json_object(path: str | Path) -> dict:
    """The JSON object in ``path``. InputError naming the file when it cannot be read, is not JSON
    or holds something else; FileNotFoundError as it is (a missing file is the caller's to explain)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read as JSON ({e})") from None
    return parse_json_object(text, path)


def parse_json_object(text: str, where: str | Path) -> dict:
    """The JSON object in ``text`` read from ``where``; InputError naming it otherwise."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InputError(f"{where}: cannot be read as JSON ({e})") from None
    if not isinstance(value, dict):
        raise InputError(f"{where}: holds a {type(value).__name__}, not the JSON object elmo writes")
    return value
