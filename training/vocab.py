"""The softmax vocabulary: ``<S>``, ``</S>``, ``<UNK>`` first, then words by descending count.

The order matters: the log-uniform candidate sampler assumes id k is the k-th most frequent word.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Container, Iterable, Sequence

import numpy as np

from storage.atomic import write_text_atomic

from .corpus import iter_sentences
from .errors import CorpusError

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)


class Vocab:
    """Token <-> id. Shape: ``ids(tokens)`` (N,) int64, unknown words -> the ``<UNK>`` id."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if missing := [s for s in SPECIALS if s not in tokens]:
            raise CorpusError(f"vocabulary lacks {missing}; it must hold <S>, </S> and <UNK>")
        if len(set(tokens)) != len(tokens):
            dup = next(t for t, c in Counter(tokens).items() if c > 1)
            raise CorpusError(f"vocabulary lists {dup!r} twice")
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.bos, self.eos, self.unk = (self.index[s] for s in SPECIALS)

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, tokens: Iterable[str]) -> np.ndarray:
        get, unk = self.index.get, self.unk
        return np.fromiter((get(t, unk) for t in tokens), dtype=np.int64)

    def sha256(self) -> str:
        """The words in their order (their ids): what a checkpoint's resume must keep."""
        return hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, "".join(t + "\n" for t in self.tokens))

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"{path}: vocabulary file not found")
        text = path.read_text(encoding="utf-8-sig", errors="ignore")  # a byte-order mark is not a word
        tokens = [t for t in (line.strip() for line in text.splitlines()) if t]
        if not tokens:
            raise CorpusError(f"{path}: the vocabulary file is empty")
        try:
            return cls(tokens)
        except CorpusError as e:
            raise CorpusError(f"{path}: {e}") from None


def count_words(path: str | Path, column: str | None = None) -> Counter:
    """Word counts over a whole corpus, streamed shard by shard."""
    counts: Counter = Counter()
    for tokens in iter_sentences(path, column):
        counts.update(tokens)
    return counts


def frequent_words(counts: Counter, min_count: int, known: Container[str] = ()) -> list[str]:
    """The words seen at least ``min_count`` times, neither special nor ``known``, the most frequent
    first (ties by spelling)."""
    return sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS and w not in known),
                  key=lambda w: (-counts[w], w))


def build_vocab(path: str | Path, min_count: int = 1, max_size: int | None = None,
                column: str | None = None) -> Vocab:
    """Words seen at least ``min_count`` times, the most frequent first (ties by spelling)."""
    counts = count_words(path, column)
    if not counts:
        raise CorpusError(f"{path}: the corpus has no tokens; cannot build a vocabulary")
    words = frequent_words(counts, min_count)
    if max_size is not None:
        words = words[: max(0, max_size - len(SPECIALS))]
    return Vocab(list(SPECIALS) + words)
