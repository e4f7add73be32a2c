"""``elmo train --init-from MODEL_DIR``: continue pretraining a biLM (published or ours) on a
domain corpus, as bilm-tf's ``restart.py`` does.

What the run starts from:
- the architecture and weights of MODEL_DIR (options.json + weights .hdf5 / .safetensors);
- its vocabulary: ``--vocab FILE`` (the published one is 793,471 words), else MODEL_DIR/vocab.txt
  (what ``elmo train`` writes); with ``--extend-vocab``, the domain words seen at least
  ``--min-count`` times that it lacks are appended (most frequent first);
- its softmax: ``--softmax FILE`` (the published ``*_softmax_weights.hdf5`` layout, datasets
  ``softmax/W`` (V, P) and ``softmax/b`` (V,), which ``elmo train`` writes as softmax.hdf5), else
  MODEL_DIR's softmax file if it has one, else a fresh softmax (see ``--freeze-encoder-steps``).
  An appended word's row starts as a copy of ``<UNK>``'s with ``log(n_new)`` off its bias: the new
  words share the probability ``<UNK>`` had, evenly; every old row is kept bit for bit.
A resumed run reads all of this from its checkpoint instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from elmo_core import ElmoConfig
from elmo_core.errors import WeightsError
from formats import load_bilm, resolve_model
from formats.model_dir import ModelFiles

from .errors import TrainingError
from .model import LanguageModel
from .vocab import Vocab, count_words, frequent_words


@dataclass(frozen=True)
class InitSource:
    """The model a run starts from, its vocabulary and its softmax file (None: a fresh softmax)."""

    files: ModelFiles
    vocab: Vocab
    vocab_path: Path
    softmax: Path | None


def init_source(model: str | Path, vocab: str | None = None, softmax: str | None = None) -> InitSource:
    model = Path(model)
    files = resolve_model(model)
    if ElmoConfig.from_json(files.options).dictionaries is not None:
        raise TrainingError(f"--init-from {model}: a model with dictionaries (ELMoForManyLangs) cannot be trained "
                            f"here yet; the training data path tokenizes with UTF-8 bytes")
    vocab_path = Path(vocab) if vocab else model / "vocab.txt"
    if not vocab_path.is_file():
        raise TrainingError(f"--init-from {model}: no vocab.txt there; pass the model's vocabulary with --vocab FILE "
                            f"(the published models' is vocab-2016-09-10.txt, 793,471 words)")
    found = [Path(softmax)] if softmax else sorted(model.glob("*softmax*.hdf5"))
    if len(found) > 1:
        raise TrainingError(f"--init-from {model}: several softmax files {[p.name for p in found]}; name one with --softmax")
    return InitSource(files, Vocab.load(vocab_path), vocab_path, found[0] if found else None)


def extend_vocabulary(vocab: Vocab, corpus: str, min_count: int, column: str | None = None) -> Vocab:
    """``vocab`` then the corpus words it lacks, seen at least ``min_count`` times, most frequent first."""
    return Vocab(vocab.tokens + frequent_words(count_words(corpus, column), min_count, vocab.index))


def load_initial_weights(lm: LanguageModel, source: InitSource, vocab: Vocab) -> None:
    """The biLM's weights, and the softmax rows of the source vocabulary (``vocab`` starts with it)."""
    bilm = load_bilm(source.files.options, source.files.weights)
    if (bilm.config.lstm, bilm.config.char_cnn) != (lm.config.lstm, lm.config.char_cnn):
        raise TrainingError(f"{source.files.options}: the architecture differs from this run's")
    with torch.no_grad():
        lm.bilm.load_state_dict(bilm.state_dict())
        if source.softmax is not None:
            W, b = read_softmax(source.softmax, len(source.vocab), lm.config.lstm.projection_dim, source.vocab_path)
            old = len(source.vocab)
            lm.softmax_w[:old], lm.softmax_b[:old] = torch.from_numpy(W), torch.from_numpy(b)
            if n_new := len(vocab) - old:
                lm.softmax_w[old:] = lm.softmax_w[source.vocab.unk]
                lm.softmax_b[old:] = lm.softmax_b[source.vocab.unk] - math.log(n_new)


def read_softmax(path: Path, n_vocab: int, dim: int, vocab_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Shape: -> W (V, P), b (V,) float32, checked against the vocabulary and the projection."""
    try:
        with h5py.File(path, "r") as f:
            if "softmax/W" not in f or "softmax/b" not in f:
                raise TrainingError(f"{path}: no softmax/W and softmax/b datasets (the published softmax layout)")
            W, b = f["softmax/W"][()], f["softmax/b"][()]
    except OSError as e:
        raise WeightsError(f"{path}: not a readable hdf5 file ({e})") from None
    if W.shape != (n_vocab, dim) or b.shape != (n_vocab,):
        raise TrainingError(f"{path}: softmax/W is {W.shape} and softmax/b {b.shape}, but the vocabulary {vocab_path} "
                            f"has {n_vocab:,} words and the model's projection is {dim}: expected ({n_vocab}, {dim}) "
                            f"and ({n_vocab},); pass the vocabulary the softmax was trained with")
    return W.astype(np.float32), b.astype(np.float32)
