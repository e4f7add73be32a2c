"""A text, CSV, TSV or JSON Lines input's bytes: the block pyarrow's readers take at a time, the
file's lines (raw: split at \\n; as text: the one rule of text lines) and the one refusal of bytes
that are not UTF-8 (``not_utf8``), which each of these formats is."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from elmo_core.errors import InputError
from storage.locations import open_input

BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark
BLOCK_BYTES = 1 << 22  # pyarrow's CSV and JSON readers' block; the first gives a JSON Lines file's types


def _line_blocks(f, chunk: int = 1 << 20, drop_bom: bool = False) -> Iterator[bytes]:
    """A binary file's whole lines a chunk (``chunk`` bytes or so) at a time, each block ending at a
    \\n but the file's last, which may lack it; ``drop_bom``: a byte-order mark at the file's start
    left out. The one splitter of both readers: a store's file (pyarrow's NativeFile) reads but does
    not iterate by lines."""
    rest, first = b"", True
    while data := f.read(chunk):
        buf = rest + data
        if first and drop_bom:
            buf = buf.removeprefix(BOM)
        first = False
        cut = buf.rfind(b"\n") + 1  # whole lines only; the rest waits for the next chunk
        if cut:
            yield buf[:cut]
        rest = buf[cut:]
    if rest:
        yield rest


def raw_lines(f, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A binary file's lines, each with its \\n (the last one may lack it), a byte-order mark kept."""
    for block in _line_blocks(f, chunk):
        *lines, last = block.split(b"\n")
        yield from (line + b"\n" for line in lines)
        if last:
            yield last


def not_utf8(path: Path | str, where: str, error: UnicodeDecodeError | None = None) -> InputError:
    """The one refusal of bytes that are not UTF-8 in a text, CSV, TSV or JSON Lines INPUT (UTF-8
    text each), naming the file and ``where`` they are (a line; a CSV record and its column)."""
    return InputError(f"{path}: {where} is not UTF-8{f' ({error})' if error else ''}; a text, CSV, TSV or JSON "
                      f"Lines INPUT is UTF-8 text: convert the file (iconv -f ITS_ENCODING -t UTF-8)")


def decoded(raw: bytes, path: Path | str, line: int, encoding: str = "utf-8") -> str:
    """A line's bytes as text; ``not_utf8`` naming line ``line`` where they are not UTF-8."""
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise not_utf8(path, f"line {line}", e) from None


def text_lines(raw_lines: Iterator[bytes], path: Path | str) -> Iterator[str]:
    """A text file's lines, as Python's text mode reads them (the one rule of both text doors: a line
    ends at \\n, \\r\\n or \\r, its break not kept), from its raw lines (split at \\n); a byte-order mark
    at the start is not text. InputError naming the line that is not UTF-8."""
    n = 0
    for k, raw in enumerate(raw_lines):
        text = decoded(raw, path, n + 1, "utf-8-sig" if k == 0 else "utf-8")
        pieces = re.sub(r"\r?\n\Z", "", text).split("\r")  # an old Mac file's lines end at a lone CR
        if text.endswith("\r"):
            pieces.pop()  # a CR that ends the file's last line: no line after it
        for piece in pieces:
            n += 1
            yield piece


def line_chunks(path: Path | str) -> Iterator[tuple[bytes, int]]:
    """A file's whole lines a chunk (1 MiB or so) at a time, each with the number of its first line;
    a byte-order mark at the file's start left out."""
    line = 1
    with open_input(path) as f:
        for block in _line_blocks(f, drop_bom=True):
            yield block, line
            line += block.count(b"\n")
