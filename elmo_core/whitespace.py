"""The one rule that turns text into tokens: split at whitespace, Python's ``str.split()``.

It is the rule of the original (bilm-tf reads ``line.strip().split()``) and of ``allennlp elmo``.
Whitespace is every character ``str.isspace()`` accepts (29 in Unicode 15: ASCII's six, the
separators U+001C..U+001F, U+0085, NBSP, U+3000, the U+2000 spaces, ...). Zero-width characters
(U+200B) and NUL are not whitespace: they stay inside their token.

``TOKEN_PATTERN`` is the same rule as an RE2 pattern, so that Arrow counts a column's tokens
(``pyarrow.compute.count_substring_regex``) exactly as ``split_tokens`` splits them.
"""
from __future__ import annotations

import itertools
import re

# every character ``str.isspace()`` accepts, listed (a scan of all code points at import took ~0.2 s;
# tests/core/test_whitespace.py scans them and compares)
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
TOKEN_PATTERN = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]+"
_TOKEN = re.compile("[^" + re.escape(WHITESPACE) + "]+")


def split_tokens(text: str) -> list[str]:
    """The tokens of a whitespace-tokenized text (none for an empty or all-whitespace text)."""
    return text.split()


def token_spans(text: str, limit: int | None = None) -> list[tuple[int, int]]:
    """Each token's [start, stop) character offsets in ``text``: ``text[a:b]`` are split_tokens(text);
    ``limit``: the first that many only (the rest of the text not scanned)."""
    return [m.span() for m in itertools.islice(_TOKEN.finditer(text), limit)]
