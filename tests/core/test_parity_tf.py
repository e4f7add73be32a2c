"""Parity with the original TensorFlow ELMo (bilm-tf), on its own outputs in ../shared."""
from __future__ import annotations

import json

import h5py
import numpy as np
import torch

from elmo_core import StatefulBiLM, batch_to_ids, tokens_to_char_ids

from formats import load_bilm
from inference import Embedder

# float32 TF vs float32 torch on the full-size model: other kernels and sum orders (errors ~1e-6 on
# outputs of ~1-10)
ATOL = 1e-5


def test_stateful_top_layer_matches_tensorflow(fixture_dir):
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    sentences = json.loads((fixture_dir / "sentences.json").read_text())
    refs = [h5py.File(fixture_dir / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    stateful = StatefulBiLM(model)
    worst = 0.0
    with torch.inference_mode():
        for i in range(10):  # batch i = item i of each of the 3 lists, run in order
            batch = [sentences[k][i].split() for k in range(3)]
            out = stateful.run(torch.from_numpy(batch_to_ids(batch)))
            for k, sent in enumerate(batch):
                top = out.layers[k, -1, : len(sent)].numpy()  # (n, 2P)
                ref = refs[k][str(i)][...]  # (2, n, P): forward, backward
                got = np.stack([top[:, :16], top[:, 16:]])
                assert got.shape == ref.shape
                np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
                worst = max(worst, float(np.abs(got - ref).max()))
    assert worst < ATOL


def test_stateful_embedder_api_matches_tensorflow(fixture_dir):
    emb = Embedder.from_files(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5", stateful=True, batch_size=3)
    sentences = json.loads((fixture_dir / "sentences.json").read_text())
    ordered = [sentences[k][i].split() for i in range(10) for k in range(3)]
    tops = emb.embed_sentences(ordered, output="top")
    ref = h5py.File(fixture_dir / "lm_embeddings_2.hdf5", "r")["9"][...]
    np.testing.assert_allclose(np.stack([tops[-1][:, :16], tops[-1][:, 16:]]), ref, atol=ATOL, rtol=0)


def test_stateless_differs_from_stateful_reference(fixture_dir):
    """The reference is stateful: running stateless must not match it (so the test above means something)."""
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    sentences = json.loads((fixture_dir / "sentences.json").read_text())
    batch = [sentences[k][5].split() for k in range(3)]
    with torch.inference_mode():
        top = model.run(torch.from_numpy(batch_to_ids(batch))).layers[0, -1, : len(batch[0])].numpy()
    ref = h5py.File(fixture_dir / "lm_embeddings_0.hdf5", "r")["5"][...]
    assert np.abs(np.stack([top[:, :16], top[:, 16:]]) - ref).max() > 1e-2


def test_token_embeddings_match_tensorflow(fixture_dir):
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    vocab = (fixture_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    vocab = [v for v in vocab if v]
    ref = h5py.File(fixture_dir / "elmo_token_embeddings.hdf5", "r")["embedding"][...]
    assert len(vocab) == ref.shape[0]
    with torch.inference_mode():
        got = model.encoder(torch.from_numpy(tokens_to_char_ids(vocab))).numpy()
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
