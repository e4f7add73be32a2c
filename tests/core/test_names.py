"""The output names users bring from TF-Hub and Spark NLP (``elmo_core.names.HUB_OUTPUTS``) and single
layers (``layer:N``), in the library, the job's options and the CLI (the server's are in
tests/serving/test_app.py)."""
from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from elmo_core.errors import InputError, SettingError
from elmo_core.names import OUTPUT_NAMES, resolve_output
from inference import Embedder
from elmo_core.vectors import VectorRequest
from pipelines.options import EmbedOptions

from tests.helpers import SENTENCES


def test_names_resolve_to_our_outputs():
    assert resolve_output("word_emb", None) == ("layer:0", None)
    assert resolve_output("lstm_outputs2", None) == ("layer:2", None)
    assert resolve_output("elmo", "max") == ("mixed", "max")
    assert resolve_output("default", None) == ("mixed", "mean") == resolve_output("default", "mean")
    assert resolve_output("layer:5", None) == ("layer:5", None)
    for bad in ("layer:", "layer:-1", "layer:x", "bottom"):
        with pytest.raises(InputError, match="output must be one of"):
            resolve_output(bad, None)
    with pytest.raises(InputError, match="mean pool"):
        VectorRequest("default", pool="max")
    assert EmbedOptions.coerce(output="default").vectors.pool == "mean"
    assert EmbedOptions.coerce(output="elmo").vectors.output == "mixed"


def test_single_layers_are_the_layers_of_all(tiny_dir):
    emb = Embedder.from_files(tiny_dir)
    every = emb.embed_sentences(SENTENCES, output="all")  # (L+1, T, D) each
    for name, layer in (("word_emb", 0), ("lstm_outputs1", 1), ("layer:2", 2), ("top", 2)):
        for got, want in zip(emb.embed_sentences(SENTENCES, output=name), every):
            np.testing.assert_array_equal(got, want[layer])
    with pytest.raises(InputError, match="layers 0 to 2"):
        emb.embed_sentences(SENTENCES, output="layer:3")


def test_elmo_embed_takes_them_as_its_output(tiny_dir, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=30, files=1)
    for name in ("all", "lstm_outputs1"):
        assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / name), "--model", str(tiny_dir), "--output", name,
                     "--quiet"]) == 0
    every = ds.dataset(tmp_path / "all", format="parquet").to_table().column("elmo").to_pylist()
    one = ds.dataset(tmp_path / "lstm_outputs1", format="parquet").to_table().column("elmo").to_pylist()
    for a, b in zip(every, one):
        np.testing.assert_array_equal(np.asarray(b, np.float32).reshape(len(b), -1),
                                      np.asarray(a, np.float32)[:, 1] if a else np.zeros((0, 16), np.float32))
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "bad"), "--model", str(tiny_dir), "--output", "layer:7"]) == 2


@pytest.mark.parametrize("output, pool, text", [
    ("bottom", None, f"`output` must be one of {OUTPUT_NAMES}, got 'bottom'"),
    (None, None, f"`output` must be one of {OUTPUT_NAMES}, got NoneType None"),
    ("default", "max", "`output` 'default' is the mean pool of the mix; give `pool` mean or none"),
])
def test_an_output_name_refused_names_its_settings_as_every_setting_check_does(output, pool, text):
    """Quoted as `threads` and `device` are (a SettingError: each door spells the names as its users
    type them, the CLI as --output and --pool)."""
    with pytest.raises(SettingError) as e:
        resolve_output(output, pool)
    assert e.value.text == text
    assert e.value.spelled(lambda name: f"--{name}").startswith("--output ")
