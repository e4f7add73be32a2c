"""Perplexity with the full softmax: forward, backward and their mean (exp of the mean NLL).

Stateless by default, as the model is used (each sentence from a zero state); ``stateful=True``
is bilm-tf's evaluation: ``batch_size`` rows each read a continuous stream of sentences, the LSTM
state carried from sentence to sentence. The LSTM runs the inference recurrence
(``inference.fast_path``), as ``elmo embed`` does.
"""
from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import torch

from elmo_core import ElmoConfig
from storage.atomic import atomic_path
from elmo_core.errors import WeightsError
from formats import resolve_model
from formats.model_dir import load_weights
from formats.weights_hdf5 import open_weights_hdf5
from inference.fast_path import FastInference

from .corpus import check_scoring
from .data import BpttBatcher, SentenceBatcher, SentenceStream
from .errors import CorpusError
from .model import LanguageModel
from .vocab import Vocab

SOFTMAX_NAME = "softmax.hdf5"


def _on_the_fast_path(score: Callable[..., dict]) -> Callable[..., dict]:
    """Run ``score(lm, ...)`` with the inference recurrence plugged into ``lm.bilm``
    (``inference.fast_path``; autograd is off there), and the model as it was afterwards."""
    @functools.wraps(score)
    def scored(lm: LanguageModel, *args: Any, **kwargs: Any) -> dict:
        previous = lm.bilm.fast_path
        lm.bilm.use_fast_path(FastInference(lm.bilm))
        try:
            return score(lm, *args, **kwargs)
        finally:
            lm.bilm.use_fast_path(previous)
    return scored


@_on_the_fast_path
@torch.no_grad()
def perplexity(lm: LanguageModel, path: str | Path, vocab: Vocab, batch_size: int = 32,
               max_sentences: int | None = None, column: str | None = None, device: str = "cpu",
               stateful: bool = False, progress: Callable[[int, int], None] | None = None,
               deadline: float | None = None) -> dict:
    """Each sentence scored alone (<S> .. </S>, from a zero state), every prediction counted; with
    ``stateful`` the state runs on across sentences (module doc; ``max_sentences`` is then refused:
    the rows' streams read the whole corpus).
    ``progress(sentences, predictions)`` is called after each batch. ``deadline`` (a
    ``time.perf_counter()``): no batch is started that would end after it, by the longest batch
    so far (the first always runs); the result then counts the sentences scored, and says
    ``cut_by_deadline``.

    Returns forward, backward, mean perplexity and the number of predictions per direction.
    """
    check_scoring(path, batch_size, max_sentences, column, stateful)
    was_training = lm.training
    lm.eval()
    try:
        sums, count, sentences, cut = _score(lm, path, vocab, batch_size, max_sentences, column, device, stateful,
                                             progress, deadline)
    finally:
        lm.train(was_training)
    if count == 0:
        raise CorpusError(f"{path}: no sentence to evaluate on")
    fwd, bwd = (sums / count).tolist()
    return {"forward": math.exp(fwd), "backward": math.exp(bwd), "mean": math.exp(0.5 * (fwd + bwd)),
            "predictions": count, "sentences": sentences, **({"cut_by_deadline": True} if cut else {})}


def _score(lm: LanguageModel, path: str | Path, vocab: Vocab, batch_size: int, max_sentences: int | None,
           column: str | None, device: str, stateful: bool, progress: Callable[[int, int], None] | None,
           deadline: float | None) -> tuple[torch.Tensor, int, int, bool]:
    """``perplexity``'s batches, the model in eval mode: (the summed NLL of each direction (2,)
    float64, predictions, sentences scored, whether the deadline cut the run)."""
    stream = SentenceStream(path, n_epochs=1, column=column)
    chars = lm.config.char_cnn.max_characters_per_token
    if stateful:
        batcher = BpttBatcher(stream, vocab, batch_size, lm.config.training.unroll_steps, chars, reset=False)
        state = lm.zero_state(batch_size)  # on the model's device, where the batches go
    else:
        batcher, state = SentenceBatcher(stream, vocab, batch_size, chars), None
    sums, count, sentences, longest = torch.zeros(2, dtype=torch.float64), 0, 0, 0.0
    while stateful or max_sentences is None or sentences < max_sentences:
        started = time.perf_counter()
        if deadline is not None and count and started + longest > deadline:
            return sums, count, sentences, True
        if (batch := batcher.next_batch()) is None:
            break
        if not stateful and max_sentences is not None and sentences + batch.mask.shape[0] > max_sentences:
            batch = batch.rows(0, max_sentences - sentences)
        _, nll, final = lm(batch.chars.to(device), batch.targets.to(device), batch.mask.to(device), state)
        state = final if stateful else None
        sums += nll.double().cpu()
        count += batch.n_tokens
        sentences = stream.stats.sentences if stateful else sentences + batch.mask.shape[0]
        if progress is not None:
            progress(sentences, count)
        longest = max(longest, time.perf_counter() - started)
    return sums, count, sentences, False


def save_softmax(lm: LanguageModel, path: Path) -> None:
    """Softmax weights beside the published weights: datasets softmax/W (V, P), softmax/b (V,)."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("softmax/W", data=lm.softmax_w.detach().cpu().numpy().astype(np.float32))
        f.create_dataset("softmax/b", data=lm.softmax_b.detach().cpu().numpy().astype(np.float32))


def load_language_model(model: str | Path, weights: str | Path | None = None) -> tuple[LanguageModel, Vocab]:
    """A trained model: a directory (or its options.json) holding options.json, the weights (``weights``:
    the file to take, as ``formats.resolve_model``), softmax.hdf5 and vocab.txt."""
    files = resolve_model(model, weights)
    model_dir = files.options.parent
    vocab = Vocab.load(model_dir / "vocab.txt")
    lm = LanguageModel(ElmoConfig.from_json(files.options), len(vocab))
    load_weights(lm.bilm, files)
    sm = model_dir / SOFTMAX_NAME
    if not sm.is_file():
        raise WeightsError(f"{sm}: softmax weights not found; perplexity needs a model written by `elmo train`")
    with open_weights_hdf5(sm) as f:
        for name, param in (("softmax/W", lm.softmax_w), ("softmax/b", lm.softmax_b)):
            if name not in f or tuple(f[name].shape) != tuple(param.shape):
                raise WeightsError(f"{sm}: dataset {name} missing or not of shape {tuple(param.shape)} "
                                   f"(vocab.txt has {len(vocab)} words)")
            param.data.copy_(torch.from_numpy(f[name][...]))
    return lm.eval(), vocab
