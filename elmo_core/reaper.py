"""Processes that must not outlive their parent: the local Ray cluster that ``ray.init()`` starts
(raylet, GCS, workers) survives a kill -9 of the driver that started it. ``reap_with(pid, pids)``
starts a small watcher in a session of its own that waits for that pid to end and then ends
those processes, if they are still the same ones (Linux /proc).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, by parent pid (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def watch(parent: int, pids: list[int], poll: float = 0.5) -> None:
    """Wait for ``parent`` to end, then SIGKILL ``pids`` that are still the same processes."""
    started = {p: _start_time(p) for p in pids}
    while Path(f"/proc/{parent}").exists():
        time.sleep(poll)
    for p, t in started.items():
        if t is not None and _start_time(p) == t:  # not a new process that reused the pid
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def reap_with(parent: int, pids: list[int]) -> subprocess.Popen | None:
    """Start the watcher that ends ``pids`` when ``parent`` ends; None where /proc is absent."""
    if not Path("/proc/self/stat").exists() or not pids:
        return None
    code = "import sys; from elmo_core.reaper import watch; watch(int(sys.argv[1]), [int(p) for p in sys.argv[2:]])"
    return subprocess.Popen([sys.executable, "-c", code, str(parent), *map(str, pids)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
