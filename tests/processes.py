"""Processes a test starts, and waiting on what they do, on a machine that may be busy.

A test waits for the condition it needs (``wait_until``), never for a fixed time, bounded
generously (``WAIT_S``) so that a real hang still fails; and every process it starts ends with the
test, passed or failed: ``start_process`` puts it in a session (a process group) of its own, which
``stop_process`` ends whole, with whatever the process started. The ``spawn`` fixture
(tests/conftest.py) and ``ServerProcess`` (tests/serving/server_utils.py) do both.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable, Sequence

WAIT_S = 120.0  # a condition that has not come in this long, on a loaded 2-core machine, is not coming
POLL_S = 0.02


def wait_until(condition: Callable[[], object], what: str, timeout: float = WAIT_S,
               proc: subprocess.Popen | None = None, poll: float = POLL_S) -> None:
    """Return once ``condition()`` is true (asked every ``poll`` s); AssertionError naming ``what``
    after ``timeout`` s, or as soon as ``proc`` (the process that should bring the condition about)
    has exited without it."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: not reached; the process exited first with {proc.returncode}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached in {timeout:.0f} s")
        time.sleep(poll)


def start_process(cmd: Sequence[object], **kw) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """``subprocess.Popen(cmd, **kw)`` in a session of its own: the process and all it starts form
    one process group, which ``stop_process`` ends."""
    return subprocess.Popen([str(c) for c in cmd], start_new_session=True, **kw)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it: until it is reaped its pid, and so its
    process group's id, cannot be given to another process."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def stop_process(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """End ``proc`` and its process group: SIGTERM, then SIGKILL to whatever of the group is left
    after ``grace`` s (processes it started that outlived it too); reaps ``proc``. A process the test
    already reaped still has its group killed: its children may have outlived it, and Linux reuses
    no pid while a process group of that id exists."""
    if proc.returncode is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group has no process left
            pass
        return
    try:
        if not _exited(proc):
            os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while not _exited(proc) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has no process left
        pass
    except ChildProcessError:  # reaped meanwhile (Popen.poll in another thread)
        return
    proc.wait()
