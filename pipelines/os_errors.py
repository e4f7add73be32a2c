"""OS errors (a full disk, a read-only file system, no permission, ...) as the ElmoErrors every
runner reports: the path, its cause in words and what to do. Those whose cause lasts are not
retried: a Spark task or a Ray actor returns them as the local runner raises them."""
from __future__ import annotations

import contextlib
import errno
from typing import Any, Iterator

from elmo_core.errors import ElmoError, InputError

from .errors import OutputDirError

RERUN = "rerun with --resume (finished shards are kept)"


@contextlib.contextmanager
def os_errors(out: Any, rerun: str = RERUN) -> Iterator[None]:
    """An OS error (disk full, read-only file system, no permission, ...) as an ElmoError naming the
    path (``out``: OUTPUT_DIR, a local path or an output); ``rerun`` says how to go on once the disk has room."""
    try:
        yield
    except OSError as e:
        raise os_error(e, out, rerun) from None


def os_error(e: OSError, out: Any, rerun: str = RERUN) -> ElmoError:
    """``os_errors``' error for ``e``."""
    where = e.filename or out
    kind = OutputDirError if str(where).startswith(str(out)) else InputError
    hint = _lasting_cause(e, rerun)
    return kind(f"{where}: {e.strerror or e}" + (f"; {hint}" if hint else ""))


def lasting_os_error(e: OSError, out: Any) -> ElmoError | None:
    """``os_error(e)`` where ``e``'s cause lasts (a full disk, a read-only file system, no
    permission), which a retry would meet again; None for another (a runner retries those)."""
    return os_error(e, out) if _lasting_cause(e, RERUN) else None


def _lasting_cause(e: OSError, rerun: str) -> str | None:
    """What to do about an OS error that a retry would meet again, in words; None for another."""
    full = f"the disk is full: free space, then {rerun}"
    read_only = "the file system is read-only: choose another OUTPUT_DIR"
    hint = {errno.ENOSPC: full, errno.EROFS: read_only, errno.EACCES: "permission denied: choose an OUTPUT_DIR you "
            "can write", errno.EDQUOT: f"the disk quota is exceeded: free space, then {rerun}"}.get(e.errno or 0)
    if hint is None:  # the same causes, where only the message names them
        hint = full if "No space left on device" in str(e) else read_only if "Read-only file system" in str(e) else None
    return hint
