"""The one rule that turns text into tokens: split at whitespace, Python's ``str.split()``.

It is the rule of the original (bilm-tf reads ``line.strip().split()``) and of ``allennlp elmo``.
Whitespace is every character ``str.isspace()`` accepts (29 in Unicode 15: ASCII's six, the
separators U+001C..U+001F, U+0085, NBSP, U+3000, the U+2000 spaces, ...). Zero-width characters
(U+200B) and NUL are not whitespace: they stay inside their token.

``TOKEN_PATTERN`` is the same rule as an RE2 pattern, so that Arrow counts a column's tokens
(``pyarrow.compute.count_substring_regex``) exactly as ``split_tokens`` splits them.
"""
from __future__ import annotations

import re

WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
TOKEN_PATTERN = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]+"
_TOKEN = re.compile("[^" + re.escape(WHITESPACE) + "]+")


def split_tokens(text: str) -> list[str]:
    """The tokens of a whitespace-tokenized text (none for an empty or all-whitespace text)."""
    return text.split()


def token_spans(text: str) -> list[tuple[int, int]]:
    """Each token's [start, stop) character offsets in ``text``: ``text[a:b]`` are split_tokens(text)."""
    return [m.span() for m in _TOKEN.finditer(text)]
