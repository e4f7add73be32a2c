"""Processes that must not outlive their parent: the local Ray cluster that ``ray.init()`` starts
(raylet, GCS, agents, workers) survives a kill -9 of the driver that started it, and leaves its
session folder behind. ``init_local_ray`` starts a small watcher in a session of its own, before
``ray.init``, that waits for the driver to end and then ends the cluster's processes and removes
its folder (Linux /proc).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


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


def marked(marker: str) -> list[int]:
    """Live processes (other than this one) whose command line holds ``marker``, and every process
    below them."""
    roots = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            held = marker.encode() in cmdline.read_bytes()
        except OSError:
            continue
        if held and int(cmdline.parent.name) != os.getpid():
            roots.append(int(cmdline.parent.name))
    return sorted(set(roots) | {d for r in roots for d in descendants(r)})


def _kill(pids: list[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(p, signal.SIGKILL)


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def watch(parent: int, marker: str, poll: float = 0.5, settle_s: float = 2.0, give_up_s: float = 30.0) -> None:
    """While ``parent`` lives, note the processes ``marked`` by ``marker`` (their renamed children,
    such as ``ray::IDLE``, may be orphaned when their marked parent dies first). Once it ends,
    SIGKILL those still the same processes and every process marked now, until none has appeared
    for ``settle_s`` (a dying cluster may still start one), and remove the folder ``marker`` names."""
    seen: dict[int, str | None] = {}
    while Path(f"/proc/{parent}").exists():
        seen.update({p: _start_time(p) for p in marked(marker) + descendants(parent)
                     if p not in seen and p != os.getpid()})  # this watcher is one of the parent's children
        time.sleep(poll)
    _kill([p for p, t in seen.items() if t is not None and _start_time(p) == t])  # not a reused pid
    quiet_since, deadline = time.monotonic(), time.monotonic() + give_up_s
    while time.monotonic() - quiet_since < settle_s and time.monotonic() < deadline:
        if found := marked(marker):
            _kill(found)
            quiet_since = time.monotonic()
        time.sleep(0.1)
    shutil.rmtree(marker, ignore_errors=True)


def init_local_ray(ray: Any, **init_kwargs: Any) -> str:
    """``ray.init`` of a local cluster of this process's own that ends with it, however it ends.

    The cluster's temporary folder is a new one (``elmo-ray-*``), which every process of the
    cluster names on its command line (or descends from one that does: the raylet's agents and
    workers). The watcher starts *before* ``ray.init``, so a kill during start-up orphans nothing;
    when this process ends it ends those processes and removes the folder (logs, sockets, the
    session). Without /proc there is no watcher. Returns the folder.
    """
    folder = tempfile.mkdtemp(prefix="elmo-ray-")
    if Path("/proc/self/stat").exists():
        code = "import sys; from runtime.ray_local import watch; watch(int(sys.argv[1]), sys.argv[2])"
        subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), folder], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    ray.init(_temp_dir=folder, **init_kwargs)
    return folder
