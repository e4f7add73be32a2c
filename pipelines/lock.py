"""One job at a time per output: an exclusive ``flock`` on ``OUTPUT_DIR/.elmo.lock`` (Parquet), or
on ``.OUT.hdf5.lock`` beside a single output file (``--format hdf5``).

The kernel releases the lock when its holder exits, however it exits (kill -9 included), so a
lock is never stale. It holds the holder's pid, host and command line, which a refused job quotes.
Its name starts with '.', so Parquet readers and the "is OUTPUT_DIR empty" check skip it. A job
that finished deletes it while it still holds it (``finished``), so a finished output holds no
lock file; a job that locked the file just before it was deleted finds, once it holds the lock,
that the name no longer leads to the file it locked, and locks the name's file anew (``__enter__``),
so two jobs never hold two files of one name.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

from .errors import OutputDirError

LOCK_FILE = ".elmo.lock"


class OutputLock:
    """``with OutputLock(lock_file, output):`` holds ``output`` for the block, or raises
    OutputDirError naming the holder; ``then`` says what to do once it is free."""

    def __init__(self, lock_file: Path, output: Path, then: str = "rerun") -> None:
        self.path, self.output, self.then = Path(lock_file), Path(output), then
        self.fd: int | None = None

    @classmethod
    def for_dir(cls, out_dir: Path) -> "OutputLock":
        """OUTPUT_DIR of a Parquet job (its lock file inside it)."""
        return cls(Path(out_dir) / LOCK_FILE, Path(out_dir), "rerun with --resume")

    @classmethod
    def for_file(cls, out: Path) -> "OutputLock":
        """A single output file (its lock file beside it, hidden)."""
        out = Path(out)
        return cls(out.with_name(f".{out.name}.lock"), out)

    def __enter__(self) -> "OutputLock":
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise self._in_use(holder) from None
            except BaseException:
                os.close(fd)
                raise
            if self._still_named(fd):
                break
            os.close(fd)  # its holder finished and deleted it meanwhile: lock the name's file anew
        self.fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_record()) + "\n").encode(), 0)
        return self

    def _in_use(self, holder: str) -> OutputDirError:
        return OutputDirError(f"{self.output} is in use by another elmo embed job ({holder}); one job at a time per "
                              f"output: wait for it to finish or stop it (a stopped or killed job releases the lock "
                              f"itself), then {self.then}")

    def check_free(self) -> None:
        """OutputDirError naming the holder where a running job holds the lock; writes and creates
        nothing (no lock file: free). What a job asks first, before it judges what the output holds."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # none, or not a lock file: taking the lock names what is wrong with it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise self._in_use(_read_holder(fd)) from None
        finally:
            os.close(fd)

    def _open(self) -> int:
        """The lock file, opened without following a link; OutputDirError where the name is not a
        regular file of its own (a symbolic link, a hard link to another file, a FIFO), which
        writing the holder's record would overwrite or block on."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise OutputDirError(f"{self.path}: a symbolic link where the lock file should be; elmo never follows "
                                 f"it (it would overwrite the file it points to): remove it, then {self.then}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
            raise OutputDirError(f"{self.path}: {what} where the lock file should be; elmo does not write into it "
                                 f"(it would overwrite another file): remove it, then {self.then}")
        return fd

    def _still_named(self, fd: int) -> bool:
        """Whether the lock file's name still leads to the file ``fd`` holds."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)

    def finished(self) -> None:
        """The job is done: delete the lock file while it is held (the module doc says why that is safe)."""
        if self.fd is not None and self._still_named(self.fd):
            os.unlink(self.path)

    def check(self) -> None:
        """Held until released: the kernel keeps it (see pipelines.store_lock for a lock that can be lost)."""

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def holder_record(since: str | None = None, **more: object) -> dict:
    """What a lock records of its holder (both locks: this one and ``pipelines.store_lock``'s)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": since or time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(sys.argv)[:500], **more}


def describe_holder(holder: object) -> str:
    """A holder record in words, for the refusal a second job gets."""
    if not isinstance(holder, dict) or not holder:
        return "holder unknown"
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, since {holder.get('since')}: "
            f"{holder.get('command', '')}")


def _read_holder(fd: int) -> str:
    try:
        return describe_holder(json.loads(os.pread(fd, 4096, 0).decode() or "{}"))
    except (OSError, ValueError):
        return "holder unknown"
