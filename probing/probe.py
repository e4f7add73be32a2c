"""Does a biLM tell a word's uses apart? Peters et al. (2018), section 5.3 and Table 4, at our scale.

Contexts of words that are both nouns and verbs (``our work`` / ``we work``) are labelled by an
unambiguous frame: the token just before the word is a determiner or a possessive (noun) or a
modal or a subject pronoun (verb). The frame token is removed from the sentence the model sees, so
whatever tells the uses apart must come from the rest of the context.

* ``probe``: for each word and each layer (0, the char-CNN, which sees no context; 1..L, the
  biLSTM layers; the mix, their average, ``elmo embed``'s default output), a linear probe (ridge
  classifier, penalty chosen by leave-one-out) on the word's vector, trained on one set of
  contexts and scored on another: accuracy against the majority-use baseline. Layer 0 gives every
  occurrence of a word the same vector, so it scores that baseline exactly.
* ``neighbours``: a query context of each use and its nearest other contexts by the mix's cosine
  (Table 4); by layer 0 every context of the word is equally near (cosine 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from elmo_core.errors import InputError

NOUN_CUES = frozenset("the a an this our their its his my your every each".split())
VERB_CUES = frozenset("will would can could must should shall may might we they i you".split())
USES = ("noun", "verb")
DEFAULT_WORDS = ("work", "need", "hope", "help", "increase", "use", "act", "result")
LAMBDAS = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)


@dataclass(frozen=True)
class Context:
    """One use of a word: the sentence as written, where its frame token is, and the use."""
    sentence: tuple[str, ...]
    cue: int  # index of the frame token; the word follows it
    use: str  # 'noun' or 'verb'

    @property
    def tokens(self) -> list[str]:
        """What the model sees: the sentence without the frame token."""
        return list(self.sentence[:self.cue] + self.sentence[self.cue + 1:])

    @property
    def position(self) -> int:
        """The word's index in ``tokens``."""
        return self.cue

    def snippet(self, width: int = 6) -> str:
        s, k = self.sentence, self.cue + 1
        return " ".join([*s[max(0, k - width):k - 1], f"[{s[k - 1]}]", f"*{s[k]}*", *s[k + 1:k + 1 + width]])


def find_contexts(sentences: Iterable[Sequence[str]], word: str, max_tokens: int = 50) -> list[Context]:
    """Every framed use of ``word`` (exact case) in sentences of at most ``max_tokens`` tokens."""
    found = []
    for tokens in (s for s in sentences if len(s) <= max_tokens):
        for i in range(1, len(tokens)):
            if tokens[i] == word:
                cue = tokens[i - 1].lower()
                use = "noun" if cue in NOUN_CUES else "verb" if cue in VERB_CUES else None
                if use:
                    found.append(Context(tuple(tokens), i - 1, use))
    return found


def spread(contexts: list[Context], n: int) -> list[Context]:
    """At most ``n`` contexts, taken evenly through the text (every k-th), the uses in their
    natural proportion."""
    step = max(1, -(-len(contexts) // n))
    return contexts[::step][:n]


def context_vectors(embedder: object, contexts: Sequence[Context]) -> np.ndarray:
    """The word's vector in each context, every layer and the mix.
    Shape: K contexts -> (K, L+2, D): layers 0..L, then their average."""
    outs = embedder.embed_sentences([c.tokens for c in contexts], output="all")  # type: ignore[attr-defined]
    layers = np.stack([o[:, c.position] for o, c in zip(outs, contexts)])  # (K, L+1, D)
    return np.concatenate([layers, layers.mean(axis=1, keepdims=True)], axis=1)  # (K, L+2, D)


def layer_names(n_layers_with_0: int) -> list[str]:
    return [f"layer {j}" for j in range(n_layers_with_0)] + ["mix"]


def _majority(y: np.ndarray) -> float:
    """+1 or -1: the more frequent label of y (ties: -1, 'noun')."""
    return 1.0 if y.mean() > 0 else -1.0


def ridge_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """A ridge classifier in its dual form (K = X X^T, n << D), features standardised on the
    training contexts (those constant on them dropped), the penalty chosen from LAMBDAS by leave-one-out squared error (closed form,
    residual / (1 - H_ii)); with no varying feature it answers the training majority. Shape: (n, D), (n,) of +-1, (m, D) -> (m,) of +-1."""
    mu, sd = x_train.mean(0), x_train.std(0)  # (D,)
    # float32 batches of different shapes give the same token vectors to ~1e-6 relative; a feature
    # varying less than 1e-4 of the vectors' scale is constant (layer 0 is, for one word)
    keep = sd > 1e-4 * float(np.sqrt(np.mean(np.square(x_train, dtype=np.float64))))
    if not keep.any():
        return np.full(len(x_test), _majority(y_train))
    a = ((x_train[:, keep] - mu[keep]) / sd[keep]).astype(np.float64)  # (n, d)
    b = ((x_test[:, keep] - mu[keep]) / sd[keep]).astype(np.float64)  # (m, d)
    y_mean = y_train.mean()
    r = y_train - y_mean  # (n,)
    gram = a @ a.T  # (n, n)
    evals, evecs = np.linalg.eigh(gram)  # gram = V diag(e) V^T
    proj = evecs.T @ r  # (n,)
    best = None
    for lam in LAMBDAS:
        scale = lam * a.shape[1]  # per feature: the penalty grows with the number of features
        alpha = evecs @ (proj / (evals + scale))  # (n,) = (K + lam I)^-1 r
        hat_diag = np.einsum("ij,j,ij->i", evecs, evals / (evals + scale), evecs)  # (n,)
        loo = np.mean(((r - gram @ alpha) / np.maximum(1.0 - hat_diag, 1e-9)) ** 2)
        if best is None or loo < best[0]:
            best = (loo, alpha)
    scores = b @ (a.T @ best[1]) + y_mean  # (m,)
    return np.where(scores > 0, 1.0, -1.0)


@dataclass(frozen=True)
class ProbeResult:
    word: str
    layer: str
    accuracy: float
    baseline: float  # accuracy of always answering the training contexts' majority use
    n_train: int
    n_test: int


def labels(contexts: Sequence[Context]) -> np.ndarray:
    return np.array([1.0 if c.use == "verb" else -1.0 for c in contexts])


def pooled(results: list[ProbeResult]) -> list[ProbeResult]:
    """Per layer, the accuracy over every word's test contexts together."""
    out = []
    for name in dict.fromkeys(r.layer for r in results):
        rs = [r for r in results if r.layer == name]
        m = sum(r.n_test for r in rs)
        out.append(ProbeResult("all words", name, sum(r.accuracy * r.n_test for r in rs) / m,
                               sum(r.baseline * r.n_test for r in rs) / m, sum(r.n_train for r in rs), m))
    return out


def nearest(query: int, vectors: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k contexts nearest ``query`` by cosine (in float64: a weak model's contexts may differ in
    the 5th decimal only), itself excluded. Shape: vectors (K, D)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-300)  # (K, D)
    cos = unit @ unit[query]  # (K,)
    order = [int(i) for i in np.argsort(-cos, kind="stable") if i != query][:k]
    return [(i, float(cos[i])) for i in order]


def cosine_decimals(values: Sequence[float], least: int = 3, most: int = 9) -> int:
    """The fewest decimals (``least``..``most``) at which the distinct ``values`` print distinct."""
    distinct = set(values)
    return next((d for d in range(least, most) if len({f"{v:.{d}f}" for v in distinct}) == len(distinct)), most)


@dataclass(frozen=True)
class WordProbe:
    """One word's contexts and vectors. Shapes: train (n, L+2, D), test (m, L+2, D)."""
    word: str
    train: list[Context]
    test: list[Context]
    train_vectors: np.ndarray
    test_vectors: np.ndarray

    def results(self, names: Sequence[str]) -> list[ProbeResult]:
        """One probe per layer (``names``: the vectors' layers), +1 the verb use."""
        y_train, y_test = labels(self.train), labels(self.test)
        baseline = float(np.mean(y_test == _majority(y_train)))
        predicted = [ridge_predict(self.train_vectors[:, j], y_train, self.test_vectors[:, j]) for j in range(len(names))]
        return [ProbeResult(self.word, name, float(np.mean(p == y_test)), baseline, len(y_train), len(y_test))
                for name, p in zip(names, predicted)]


def collect(embedder: object, train_sentences: Sequence[Sequence[str]], test_sentences: Sequence[Sequence[str]],
            word: str, cap: int) -> WordProbe:
    """``word``'s framed uses in both texts (at most ``cap`` of each use in each) and their vectors;
    InputError unless both uses have two training contexts and the test set is not empty."""
    train = spread(find_contexts(train_sentences, word), cap)
    test = spread(find_contexts(test_sentences, word), cap)
    counts = {u: sum(c.use == u for c in train) for u in USES}
    if min(counts.values()) < 2 or not test:
        raise InputError(f"--word {word}: too few framed uses to probe (training contexts: {counts}, test: "
                         f"{len(test)}); pick a word used often both as a noun ('the {word}') and as a verb "
                         f"('we {word}'), or give more text")
    vectors = context_vectors(embedder, train + test)  # (n + m, L+2, D)
    return WordProbe(word, train, test, vectors[:len(train)], vectors[len(train):])


def split_lines(sentences: Sequence[Sequence[str]], every: int = 5) -> tuple[list, list]:
    """A user's text: every ``every``-th sentence held out for testing the probe, the rest to train it."""
    return ([s for i, s in enumerate(sentences) if i % every != every - 1],
            [s for i, s in enumerate(sentences) if i % every == every - 1])
