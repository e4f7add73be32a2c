from __future__ import annotations

import numpy as np
import pytest

from elmo_core.errors import SettingError

from elmo_core import InputError
from inference import Embedder

from tests.helpers import SENTENCES, TINY_OPTIONS
from tests.reference_impl import ReferenceElmo

L1, D = TINY_OPTIONS["lstm"]["n_layers"] + 1, 2 * TINY_OPTIONS["lstm"]["projection_dim"]


@pytest.fixture
def emb(tiny_dir):
    return Embedder.from_files(tiny_dir / "options.json", tiny_dir / "weights.hdf5")


def test_all_layers_per_sentence_in_input_order(emb, tiny_dir):
    ref = ReferenceElmo(TINY_OPTIONS, str(tiny_dir / "weights.hdf5"))
    out = emb.embed_sentences(SENTENCES, batch_size=2)
    assert [o.shape for o in out] == [(L1, len(s), D) for s in SENTENCES]
    for o, s in zip(out, SENTENCES):
        assert o.dtype == np.float32
        # float32 engine vs the float64 reference: fp32 rounding through the recurrence
        np.testing.assert_allclose(o, ref.layers(s), atol=1e-5, rtol=1e-5)


def test_batch_size_does_not_change_results(emb):
    a = emb.embed_sentences(SENTENCES, batch_size=1)
    b = emb.embed_sentences(SENTENCES, batch_size=64)
    for x, y in zip(a, b):
        # other batch compositions: float32 sums in another order
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)


def test_output_modes(emb):
    layers = emb.embed_sentences(SENTENCES)
    s = [0.2, 0.3, 0.5]
    w = np.exp(s) / np.exp(s).sum()
    mixed = emb.embed_sentences(SENTENCES, output="mixed", mix_weights=s, gamma=0.7)
    top = emb.embed_sentences(SENTENCES, output="top")
    avg = emb.embed_sentences(SENTENCES, output="average")
    equal = emb.embed_sentences(SENTENCES, output="mixed")
    for lay, m, t, a, e in zip(layers, mixed, top, avg, equal):
        assert m.shape == (lay.shape[1], D)
        # a 3-term weighted sum of |x| <~ 5 values in fp32 vs einsum: a few ulp (6e-8 x 5 each)
        np.testing.assert_allclose(m, 0.7 * np.einsum("l,ltd->td", w, lay), atol=1e-6)
        np.testing.assert_array_equal(t, lay[-1])
        np.testing.assert_allclose(a, lay.mean(0), atol=1e-6)
        np.testing.assert_allclose(e, lay.mean(0), atol=1e-6)


def test_layer_norm_mix_is_the_originals(emb):
    """bilm-tf's weight_layers(use_layer_norm=True): one mean/variance over the unmasked values of each layer."""
    sents = SENTENCES[:2]
    layers = emb.embed_sentences(sents)
    got = emb.embed_sentences(sents, output="mixed", layer_norm=True, batch_size=8)
    normed = []
    for j in range(L1):
        vals = np.concatenate([lay[j].ravel() for lay in layers])
        mean, var = vals.mean(), vals.var()
        normed.append([(lay[j] - mean) / np.sqrt(var + 1e-12) for lay in layers])
    for k in range(len(sents)):
        want = sum(normed[j][k] for j in range(L1)) / L1
        # layer-normed values (unit scale) summed in fp32 vs float64 numpy: a few ulp of O(1) terms, x batch stats
        np.testing.assert_allclose(got[k], want, atol=1e-5)
    for output in ("top", "average", "all", "layer:1"):  # no weighted sum to normalise before: refused, not ignored
        with pytest.raises(SettingError, match=f"layer_norm only applies to the mix .*not to output {output}: leave it out"):
            emb.embed_sentences(sents, output=output, layer_norm=True)


def test_empty_sentences_give_empty_arrays(emb):
    out = emb.embed_sentences([[], ["word"], []], output="all")
    assert out[0].shape == (L1, 0, D) and out[2].shape == (L1, 0, D) and out[1].shape == (L1, 1, D)
    assert emb.embed_sentences([[]], output="mixed")[0].shape == (0, D)
    assert emb.embed_sentences([]) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"output": "bogus"}, "output must be one of"),
    ({"output": "mixed", "mix_weights": [1.0, 2.0]}, "expected 3 values"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"batch_size": "2"}, "batch_size must be a positive integer"),  # was a TypeError from a comparison
    ({"output": None}, "output must be one of .* got NoneType None"),  # was an AttributeError
    ({"output": "top", "normalize": "no"}, "normalize must be true or false"),  # "no" read as true
    ({"output": "mixed", "mix_weights": 5}, "mix must be numbers"),  # was a TypeError
    ({"output": "mixed", "mix_weights": [True, False, True]}, "mix must be numbers"),
    ({"output": "mixed", "gamma": True}, "gamma must be a finite number"),
])
def test_bad_arguments(emb, kwargs, message):
    with pytest.raises(InputError, match=message):
        emb.embed_sentences(SENTENCES, **kwargs)


def test_a_policy_that_is_not_a_batch_policy_is_named_as_a_setting(tiny_dir):
    """Quoted as `batch_size` is (a SettingError naming the keyword), before the model loads."""
    with pytest.raises(SettingError) as e:
        Embedder.open(tiny_dir, policy={"max_tokens_per_batch": 64})
    assert e.value.text == "`policy` must be an inference.batching.BatchPolicy, got dict"


def test_bad_sentences(emb):
    with pytest.raises(InputError, match="sentence 1 is str"):
        emb.embed_sentences([["ok"], "not tokenized"])
    with pytest.raises(InputError, match="token 1 is float"):
        emb.embed_sentences([["ok", 1.5]])


def test_a_closed_embedder_refuses_and_library_arguments_of_the_wrong_type_are_named(tiny_dir):
    from inference import TorchBackend
    from inference.model_run import resolve_run
    from inference.run_settings import RunSettings
    from pipelines import embed_parquet

    with Embedder.open(tiny_dir) as emb:
        assert len(emb.embed_sentences(SENTENCES)) == len(SENTENCES)
    emb.close()  # twice: nothing more
    with pytest.raises(InputError, match="this Embedder is closed"):
        emb.embed_sentences(SENTENCES)
    for call, says in ((lambda: resolve_run(tiny_dir, RunSettings(threads=1), threads=2), "not both"),
                       (lambda: resolve_run(None), "model must be a path"),
                       (lambda: embed_parquet(5, "out", model=tiny_dir), "input must be a path"),
                       (lambda: embed_parquet("in", "out", model=None), "model must be a path, a ModelRun"),
                       (lambda: TorchBackend.from_files(tiny_dir, layout="bogus"), "layout must be None")):
        with pytest.raises(InputError, match=says):
            call()


def test_from_files_rejects_other_backends(tiny_dir):
    with pytest.raises(InputError, match="export directory"):
        Embedder.from_files(tiny_dir / "options.json", tiny_dir / "weights.hdf5", backend="onnx")


def test_model_directory_works_as_options(tiny_dir):
    with Embedder.from_files(tiny_dir) as e:
        assert e.embed_sentences([["hi"]], output="top")[0].shape == (1, D)
