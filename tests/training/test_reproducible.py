"""Two ``elmo train`` runs with one seed, corpus and options give the same model, bit for bit."""
from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import torch

from runtime import deterministic_algorithms

from tests.helpers import run_cli
from tests.training.train_utils import sotu_sentences, write_corpus, write_options


def _datasets(path: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_two_runs_with_one_seed_write_equal_weights(tmp_path):
    train = write_corpus(tmp_path / "train.txt", sotu_sentences())
    options = write_options(tmp_path / "tiny.json")
    # 4 threads, 64 x 20 tokens a step: the char-CNN's gradient, gathered back to 2,560 token
    # positions, is large enough for torch's parallel CPU kernels (4 threads race even on one core).
    args = ("train", "--text", train, "--options", options, "--min-count", 1, "--max-steps", 4,
            "--batch-size", 64, "--unroll", 20, "--threads", 4, "--seed", 7, "--no-tensorboard",
            "--checkpoint-every", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [run_cli(*args, "--out", tmp_path / name) for name in ("a", "b")]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert not [w for w in caught if "deterministic" in str(w.message)]  # no kernel without a deterministic twin
    for name in ("weights.hdf5", "softmax.hdf5"):
        a, b = (_datasets(tmp_path / run / "model" / name) for run in ("a", "b"))
        assert sorted(a) == sorted(b) and a
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert np.array_equal(a[key], b[key]), f"{name}:{key} differs by {np.abs(a[key] - b[key]).max():.3g}"


def test_deterministic_algorithms_restores_the_mode():
    torch.use_deterministic_algorithms(False)
    with deterministic_algorithms():
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
