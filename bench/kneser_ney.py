"""Interpolated Kneser-Ney trigram (Chen & Goodman), the n-gram baseline of bench_train.py.

Sentences are padded with two start symbols and end with the end symbol, which is predicted, as
the biLM predicts ``</S>`` (forward) and ``<S>`` (backward); OOV words are ``<UNK>``. One discount
per order, D = n1 / (n1 + 2 n2). The unigram level interpolates continuation counts with uniform.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence


def _discount(counts: Iterable[int]) -> float:
    c = Counter(counts)
    n1, n2 = c.get(1, 0), c.get(2, 0)
    return n1 / (n1 + 2 * n2) if n1 + n2 else 0.5


class KneserNeyTrigram:
    def __init__(self, sentences: Iterable[Sequence[str]], vocab: set[str], start: str, end: str) -> None:
        self.vocab, self.start, self.end = vocab, start, end
        tri: Counter = Counter()
        for s in sentences:
            toks = self._prepare(s)
            tri.update(zip(toks, toks[1:], toks[2:]))
        self.tri = tri
        self.ctx2 = Counter()  # c(u v .)
        self.types2 = Counter()  # N1+(u v .)
        cont2: Counter = Counter()  # N1+(. v w)
        for (u, v, w), c in tri.items():
            self.ctx2[(u, v)] += c
            self.types2[(u, v)] += 1
            cont2[(v, w)] += 1
        self.cont2 = cont2
        self.ctx1 = Counter()  # N1+(. v .)
        self.types1 = Counter()  # N1+(v .) among continuation bigrams
        cont1: Counter = Counter()  # N1+(. w)
        for (v, w), c in cont2.items():
            self.ctx1[v] += c
            self.types1[v] += 1
            cont1[w] += 1
        self.cont1, self.total1 = cont1, sum(cont1.values())
        self.d3, self.d2, self.d1 = _discount(tri.values()), _discount(cont2.values()), _discount(cont1.values())
        self.n_words = len(vocab | {end}) - (1 if start not in vocab | {end} else 0)

    def _prepare(self, s: Sequence[str]) -> list[str]:
        return [self.start, self.start] + [w if w in self.vocab else "<UNK>" for w in s] + [self.end]

    def _p1(self, w: str) -> float:
        d = self.d1
        return max(self.cont1[w] - d, 0) / self.total1 + d * len(self.cont1) / self.total1 / self.n_words

    def _p2(self, v: str, w: str) -> float:
        n = self.ctx1.get(v, 0)
        if n == 0:
            return self._p1(w)
        d = self.d2
        return max(self.cont2.get((v, w), 0) - d, 0) / n + d * self.types1[v] / n * self._p1(w)

    def prob(self, u: str, v: str, w: str) -> float:
        n = self.ctx2.get((u, v), 0)
        if n == 0:
            return self._p2(v, w)
        d = self.d3
        return max(self.tri.get((u, v, w), 0) - d, 0) / n + d * self.types2[(u, v)] / n * self._p2(v, w)

    def log_likelihood(self, s: Sequence[str]) -> tuple[float, int]:
        """Sum of log P over the sentence's predictions (words and the end symbol), and their count."""
        toks = self._prepare(s)
        ll = sum(math.log(self.prob(u, v, w)) for u, v, w in zip(toks, toks[1:], toks[2:]))
        return ll, len(toks) - 2


def perplexity(model: KneserNeyTrigram, sentences: Iterable[Sequence[str]]) -> float:
    total, n = 0.0, 0
    for s in sentences:
        ll, k = model.log_likelihood(s)
        total, n = total + ll, n + k
    return math.exp(-total / n)


def fwd_bwd_perplexity(train: list[list[str]], valid: list[list[str]], vocab: set[str]) -> dict:
    fwd = KneserNeyTrigram(train, vocab, "<S>", "</S>")
    bwd = KneserNeyTrigram((s[::-1] for s in train), vocab, "</S>", "<S>")
    f, b = perplexity(fwd, valid), perplexity(bwd, (s[::-1] for s in valid))
    return {"forward": f, "backward": b, "mean": math.sqrt(f * b)}
