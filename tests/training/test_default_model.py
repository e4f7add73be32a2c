"""The shipped default model: built by one command, stored in float16 only where the vectors keep
their cosine, found by `elmo demo` and `elmo engine`."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from elmo_core.errors import InputError

import training.default_model as dm
from inference import Embedder
from tests.helpers import TINY_OPTIONS


def test_build_writes_a_half_precision_model_with_its_card_and_the_demo_finds_it(tmp_path, monkeypatch, capsys):
    options = tmp_path / "tiny.json"
    options.write_text(json.dumps(TINY_OPTIONS), encoding="utf-8")
    out = tmp_path / "models" / "default"
    card = dm.build_default_model(out, tmp_path / "work", minutes=5, seed=3, log=lambda s: None,
                                  options=str(options), max_tokens=4000, valid_sentences=20,
                                  final_valid_sentences=40, train_eval_sentences=20, tensorboard=False)
    assert card["storage"] == "float16" and card["storage_min_cosine"] >= dm.MIN_COSINE
    assert card["seed"] == 3 and card["tokens"] >= 4000 and card["held_out"]["predictions"] > 0
    assert json.loads((out / "card.json").read_text()) == card
    assert not list(tmp_path.glob("models/.*.tmp"))  # the directory appeared whole
    with h5py.File(out / "weights.hdf5") as f:
        dtypes = set()
        f.visititems(lambda name, obj: dtypes.add(obj.dtype) if isinstance(obj, h5py.Dataset) else None)
    assert dtypes == {np.dtype(np.float16)}
    trained = tmp_path / "work" / "train" / "model"
    sentences = [["The", "state", "of", "the", "Union", "."], ["We", "work", "."]]
    with Embedder.from_files(trained) as a, Embedder.from_files(out) as b:
        for x, y in zip(a.embed_sentences(sentences), b.embed_sentences(sentences)):
            # float16 weights carry a relative rounding of 2^-11 each; through the char-CNN and two LSTM
            # layers the vectors move by a few times that, far inside 1e-2 of their scale
            np.testing.assert_allclose(y, x, atol=1e-2 * np.abs(x).max())

    from training.perplexity import load_language_model

    lm, vocab = load_language_model(out)  # the float16 softmax reads back for `elmo perplexity`
    assert lm.softmax_w.dtype == torch.float32 and len(vocab) == lm.softmax_w.shape[0]

    from elmo_cli.cmd_demo import get_model
    from elmo_cli.main import main

    assert main(["info", "--model", str(out)]) == 0
    assert f"trained   elmo default-model --max-minutes 5 --seed 3 ({card['built']}): {card['tokens']:,} tokens" \
        in capsys.readouterr().out

    monkeypatch.setattr(dm, "SHIPPED", out)
    assert get_model(tmp_path / "demo", None, 3.0)[0] == out
    assert get_model(tmp_path / "demo", str(trained), 3.0)[0] == trained  # MODEL= still overrides

    # the model trained before is reused only as it was trained: a card recorded --seed 5 for seed 3
    with pytest.raises(dm.TrainingError, match="trained with other settings .*seed 3 there, 5 asked"):
        dm.build_default_model(out, tmp_path / "work", minutes=5, seed=5, log=lambda s: None, options=str(options))
    mine = tmp_path / "mine"
    (mine / "thesis").mkdir(parents=True)
    (mine / "thesis" / "chapter1.txt").write_text("mine")
    with pytest.raises(dm.TrainingError, match="is not a model elmo default-model wrote"):  # it was replaced whole
        dm.build_default_model(mine, tmp_path / "work", minutes=5, seed=3, log=lambda s: None, options=str(options))
    assert (mine / "thesis" / "chapter1.txt").read_text() == "mine"


def test_an_out_where_nothing_can_be_written_is_refused_before_training(tmp_path, monkeypatch):
    """``--out`` below a file: refused at once, where the run trained for its minutes (120 by
    default) and then failed to publish."""
    monkeypatch.setattr(dm, "train_default_model", lambda *a, **k: pytest.fail("trained before checking --out"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"afile/model: .*afile is a file, not a directory"):
        dm.build_default_model(tmp_path / "afile" / "model", tmp_path / "work", 0.1)


KN_TRIGRAM = 106.0  # interpolated Kneser-Ney, the same split and vocabulary (bench/bench_train.py, docs/training.md)


@pytest.mark.skipif(dm.shipped_model() is None, reason="this checkout has no models/default (make default-model)")
def test_the_shipped_model_beats_the_kn_trigram_and_tells_uses_apart():
    from elmo_cli.cmd_probe import sotu_texts
    from probing.probe import collect, layer_names

    card = json.loads((dm.SHIPPED / dm.CARD).read_text(encoding="utf-8"))
    assert card["held_out"]["mean"] < KN_TRIGRAM and card["storage_min_cosine"] >= dm.MIN_COSINE
    train, test, _ = sotu_texts()
    with Embedder.from_files(dm.SHIPPED) as embedder:
        probe = collect(embedder, train, test, "work", cap=80)
        results = probe.results(layer_names(embedder.config.n_output_layers))
    assert results[0].accuracy == results[0].baseline  # layer 0: no context
    assert results[-1].accuracy >= results[-1].baseline + 0.15, results  # the mix reads the use from the context
