"""Where a corpus's files are and how their bytes become text, for ``elmo embed`` and ``elmo train``
alike: the input formats and their suffixes (``input_format``), ``elmo embed``'s input files of any
format (``input_files``: a file, a directory, a glob, or a file or prefix on an object store),
whether an INPUT would take a file (``would_read``), and the one UTF-8 decoder (invalid bytes
dropped, as the original reads text with ``errors="ignore"``, and reported so that callers count
them).
"""
from __future__ import annotations

import fnmatch
import glob
import os
from pathlib import Path
from typing import Iterator

from elmo_core.errors import InputError
from storage.locations import HIDDEN_PREFIXES, is_below, is_hidden, is_uri, list_files, normalize_uri

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
# elmo embed's input formats, told by a file's suffix (case-insensitive); one format per file, never guessed.
INPUT_FORMATS = {"parquet": PARQUET_SUFFIXES, "csv": (".csv",), "tsv": (".tsv",), "jsonl": (".jsonl", ".ndjson"),
                 "text": (".txt",)}
ALL_SUFFIXES = tuple(s for suffixes in INPUT_FORMATS.values() for s in suffixes)


def formats_in_words() -> str:
    return "; ".join(f"{name} ({', '.join(suffixes)})" for name, suffixes in INPUT_FORMATS.items())


def input_format(path: str | Path) -> str | None:
    """The input format a file's suffix names, or None."""
    suffix = Path(str(path)).suffix.lower()
    return next((name for name, suffixes in INPUT_FORMATS.items() if suffix in suffixes), None)


COMPRESSED_SUFFIXES = (".gz", ".tgz", ".tar", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".7z")


def input_files(spec: str | Path, unread: list | None = None) -> list[tuple[Path | str, str]]:
    """(file, format) of elmo embed's INPUT: a file, a glob, a directory or a prefix on a store.
    A directory gives its Parquet files where it holds any (what else is there is not input), else
    its files of the one other format it holds. A file whose format its suffix does not name, or a
    directory with files of several formats and no Parquet file, is an InputError naming the formats.
    ``unread``: receives the input files a directory holds beside its Parquet files, not read."""
    found = list(list_files(str(spec), ALL_SUFFIXES)) if is_uri(spec) else _local_files(spec)
    if (is_uri(spec) or Path(spec).is_dir()) and len(found) > 1:
        kinds = {input_format(p) for p in found}
        if "parquet" in kinds:
            if unread is not None:
                unread.extend(p for p in found if not is_parquet(p))
            found = [p for p in found if is_parquet(p)]
        elif len(kinds) > 1:
            raise InputError(f"{spec}: files of several input formats ({', '.join(sorted(kinds))}); a directory "
                             f"INPUT holds one format: give one file or a glob (e.g. '{str(spec).rstrip('/')}/*.csv')")
    if unknown := [p for p in found if input_format(p) is None]:
        packed = str(unknown[0]).lower().endswith(COMPRESSED_SUFFIXES)
        raise InputError(f"{unknown[0]}: cannot tell its input format from its name; elmo embed reads "
                         f"{formats_in_words()}: " + ("a compressed file is not read: decompress it (or write it as "
                                                      "Parquet, compressed inside)" if packed else
                                                      "rename the file to the suffix of its format"))
    return [(p, input_format(p)) for p in found]


def check_name(path: str | Path) -> None:
    """InputError for a local path whose name is not UTF-8 (bytes the file system holds that
    Python keeps as surrogates): pyarrow and the stores take UTF-8 names only."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            shown = os.fsencode(text).decode("utf-8", "backslashreplace")  # the file system's bytes
        except UnicodeEncodeError:  # a lone surrogate that stands for no byte (a caller's string)
            shown = text.encode("utf-8", "backslashreplace").decode("ascii")
        raise InputError(f"{shown}: the name is not UTF-8 (bytes shown as \\x..); rename it to a UTF-8 name") from None


def _local_files(spec: str | Path) -> list[Path]:
    files = _found(spec)
    for path in files:
        check_name(path)
    return files


def _found(spec: str | Path) -> list[Path]:
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in _walk(path) if input_format(p) and not is_hidden(str(p.relative_to(path))))
        if not files:
            raise InputError(f"{path}: no input files in this directory; elmo embed reads {formats_in_words()}")
        return files
    matches = sorted(Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file())
    if not matches:
        raise InputError(f"{spec}: no such file, directory, or files matching this pattern")
    return matches


def _walk(root: Path) -> list[Path]:
    """The files under ``root``, through links to folders too: each real folder once, as itself where
    it lies under ``root`` (else through its first link by name); hidden folders (``_``, ``.``) not
    entered, their links neither."""
    top, seen, files = Path(os.path.realpath(root)), set(), []
    for folder, dirs, names in _visible(os.walk(root, followlinks=True)):
        real = os.path.realpath(folder)
        if real in seen or (os.path.islink(folder) and Path(real).is_relative_to(top)):
            dirs[:] = []  # read once, as itself: a link that loops back or leads to a folder of root's
            continue
        seen.add(real)
        files += [p for p in (Path(folder, n) for n in names) if p.is_file()]
    return files


def _visible(walk: Iterator[tuple[str, list[str], list[str]]]) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk``'s steps, hidden folders pruned before they are entered, the rest in name order."""
    for folder, dirs, names in walk:
        dirs[:] = sorted(d for d in dirs if not d.startswith(HIDDEN_PREFIXES))
        yield folder, dirs, names


def is_parquet(path: str | Path) -> bool:
    return Path(str(path)).suffix.lower() in PARQUET_SUFFIXES


def would_read(spec: str | Path, path: str | Path) -> bool:
    """Whether INPUT ``spec`` (as ``input_files`` resolves it) would take a Parquet file at
    ``path`` once one is there: ``path`` below the directory or prefix, or matched by the glob."""
    if is_uri(spec) or not glob.has_magic(str(spec)):
        if not is_below(path, spec):
            return False
        base = normalize_uri(str(spec)) if is_uri(spec) else str(Path(spec).resolve())
        here = normalize_uri(str(path)) if is_uri(path) else str(Path(path).resolve())
        return is_parquet(here) and not is_hidden(here[len(base):].lstrip("/"))
    if is_uri(path):
        return False
    pattern = Path(os.path.abspath(spec)).parts
    return is_parquet(path) and _glob_matches(pattern, Path(os.path.abspath(path)).parts)


def _glob_matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """``glob.glob(..., recursive=True)``'s rule, one path component at a time ('**': any number)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_matches(pattern[1:], parts[1:])


def decode_utf8(data: bytes) -> tuple[str, bool]:
    """(the text, whether it held invalid UTF-8, whose bytes are dropped)."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="ignore"), True
