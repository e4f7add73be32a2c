"""The one way this project writes a file: whole or not at all.

``atomic_path(path)`` gives a temporary name beside ``path`` (``.NAME.PID.tmp``: hidden from
readers, unique to the writing process, so two writers never share one); when the block ends
without an error the file is fsynced, renamed over ``path`` and its directory fsynced, so after a
crash ``path`` holds either its old content or the whole new one. On an error the temporary file
is removed. ``atomic_dir(path, complete)`` does the same for a directory built once and shared by
processes (a cache entry): of several builders, the first rename wins and the others keep it.
Cleaners of a directory recognise leftovers by the ``.*.tmp`` pattern.
``read_json_object`` is the one way it reads back the JSON records it writes.
"""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import InputError

TMP_GLOB = ".*.tmp"


def fsync(path: str | Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write ``tmp``; it becomes ``p`` when the block succeeds."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path, complete: str, replace: bool = False) -> Iterator[Path]:
    """``with atomic_dir(d, "manifest.json") as tmp:`` fill the new directory ``tmp``; it becomes
    ``d`` when the block succeeds. If another process published ``d`` meanwhile (its ``complete``
    file is there), theirs is kept and this one dropped; with ``replace`` an existing ``d`` is
    moved aside and removed instead (readers see the old directory or the new one, never a mix).
    On an error ``tmp`` is removed and ``d`` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = (path.with_name(f".{path.name}.{os.getpid()}{k}.tmp") for k in ("", ".old"))
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


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(obj: Any, **dumps: Any) -> str:
    """How the project writes a JSON record (``dumps``: json.dumps's options; default indent 2,
    sorted keys), one line ending."""
    return json.dumps(obj, **({"indent": 2, "sort_keys": True} | dumps)) + "\n"


def write_json_atomic(path: str | Path, obj: Any, **dumps: Any) -> None:
    """``obj`` as JSON (``json_text``), whole or not at all."""
    write_text_atomic(path, json_text(obj, **dumps))


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
