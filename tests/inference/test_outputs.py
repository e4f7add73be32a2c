"""Output modes as layer weights (``layer_weights``) and every backend's ``run_combined`` against the
reference ``reduce_layers``, in float32 and float16."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from elmo_core import batch_to_ids
from elmo_core.errors import InputError, SettingError
from elmo_core.kinds import Dtype
from elmo_core.vectors import layer_weights
from inference import Embedder, reduce_layers
from elmo_core.vectors import VectorRequest
from inference.backends import BackendBase
from tests.helpers import SENTENCES


@pytest.mark.parametrize("output, mix, gamma", [("top", None, 1.0), ("average", None, 1.0), ("mixed", None, 1.0),
                                                ("mixed", [0.5, -2.0, 1.0], 0.7)])
def test_run_combined_equals_reduce_layers(tiny_dir, output, mix, gamma):
    backend = Embedder.from_files(tiny_dir).backend
    ids = batch_to_ids(SENTENCES + [[]])
    layers, mask = backend.run(ids)
    want = reduce_layers(layers, mask, output, mix, gamma)  # (B, T, D)
    weights = layer_weights(output, 3, mix, gamma)
    got, got_mask = backend.run_combined(ids, weights)
    np.testing.assert_array_equal(got_mask, mask)
    # the backend's fp32 weighted sum of 3 layers vs reduce_layers': a few ulp of |x| <~ 5
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    generic, _ = BackendBase.run_combined(backend, ids, weights)  # what the ONNX / TensorRT backends do
    np.testing.assert_allclose(generic, want, atol=1e-6, rtol=0)
    half, _ = backend.run_combined(ids, weights, np.float16)
    assert half.dtype == np.float16
    # float16 output: 2**-11 relative rounding (~5e-4) at |x| <~ 4
    np.testing.assert_allclose(half.astype(np.float32), want, atol=2e-3, rtol=2e-3)


def test_all_has_no_layer_weights_and_the_stateful_backend_combines_after_run(tiny_dir):
    assert layer_weights("all", 3) is None
    stateful = Embedder.from_files(tiny_dir, stateful=True).backend
    ids = batch_to_ids(SENTENCES)
    weights = layer_weights("average", 3)
    got, mask = stateful.run_combined(ids, weights)  # from the zero state, as the run after the reset
    stateful.reset_state()
    layers, _ = stateful.run(ids)
    # fp32 mean of 3 layers computed in two orders: a few ulp
    np.testing.assert_allclose(got, reduce_layers(layers, mask, "average"), atol=1e-6, rtol=0)


@pytest.mark.parametrize("output, mix, gamma, named", [
    ("layer:1", None, 5.0, "gamma only applies to the mix (output mixed), not to output layer:1: leave it out"),
    ("top", (0.0, 1.0, 2.0), 1.0, "mix only applies to the mix (output mixed), not to output top"),
    ("all", (0.0, 1.0, 2.0), 2.0, "mix and gamma only apply to the mix (output mixed), not to output all: leave them"),
    ("word_emb", None, 0.5, "not to output word_emb (layer:0): leave it out"),  # named as asked
])
def test_a_mix_setting_an_output_would_ignore_is_refused_by_every_door(tiny_dir, output, mix, gamma, named):
    """VectorRequest is what `elmo embed`, the HTTP body, Spark and the Embedder make: the check is there once."""
    with pytest.raises(SettingError, match=re.escape(named)):
        VectorRequest(output, mix, gamma)
    with Embedder.from_files(tiny_dir) as embedder, pytest.raises(SettingError, match=re.escape(named)):
        embedder.embed_sentences(SENTENCES, output=output, mix_weights=mix, gamma=gamma)
    assert VectorRequest("default", mix, gamma).mode.mixes  # TF-Hub's default is the mix, mean-pooled


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("taken", [1.0, 0.9, 0.2])  # the share of the batch's positions taken
def test_finish_on_device_takes_the_tokens_in_the_request_dtype(dtype, normalize, taken):
    """Only the taken tokens, in the order asked, each unit length if asked, in the dtype:
    casting first where most rows are taken gives the same values as taking first."""
    from inference.outputs import finish_on_device, unit_norm

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 9, 3, 16, generator=gen)  # (B, T, L+1, D)
    take = torch.randperm(54, generator=gen)[: int(54 * taken)]  # (n,) flat positions, any order
    request = VectorRequest("all", normalize=normalize, dtype=dtype)
    got = finish_on_device(x, request, take=take)
    want = x.reshape(54, 3, 16)[take]
    if normalize:  # against float64's x / |x|, within float32's rounding (a few ulp), then the same cast
        exact = (want.double() / torch.linalg.vector_norm(want.double(), dim=-1, keepdim=True))
        assert (got.double() - exact).abs().max() < (1e-6 if dtype == "float32" else 1e-3)
        want = unit_norm(want)
    want = want.to(got.dtype)
    assert got.dtype == Dtype.of(dtype).torch and got.shape == (len(take), 3, 16)
    assert torch.equal(got, want)


def test_unit_norm_holds_at_every_scale_float32_holds():
    """A vector's squares overflow float32 from |x| ~ 1.8e19 and all vanish below ~1e-23: a gamma
    of 1e20 with normalize gave zero vectors, one of 1e-30 vectors of norm 1e-30. Each is unit
    length within float32's rounding of the float64 answer; zero stays zero; inf gives NaN (the
    finiteness check names it after)."""
    from inference.outputs import unit_norm

    gen = torch.Generator().manual_seed(3)
    base = torch.randn(5, 64, generator=gen, dtype=torch.float64)  # (N, D)
    for scale in (1e-38, 1e-30, 1e-20, 1.0, 1e19, 1e20, 1e36):
        x = (base * scale).float()
        got = unit_norm(x).double()
        want = x.double() / torch.linalg.vector_norm(x.double(), dim=-1, keepdim=True)
        assert (got - want).abs().max() < 1e-6, scale
        assert (torch.linalg.vector_norm(got, dim=-1) - 1).abs().max() < 1e-6, scale
    assert torch.equal(unit_norm(torch.zeros(2, 8)), torch.zeros(2, 8))
    assert unit_norm(torch.tensor([[1.0, float("inf")]])).isnan().any()


def test_normalize_gives_the_same_unit_vectors_whatever_gamma(tiny_dir):
    """``normalize`` divides gamma out: gamma 1e20 and 1e-30 give gamma 1's unit vectors (within
    float32 rounding), per token and pooled, where the token path gave zeros and 1e-30s."""
    with Embedder.from_files(tiny_dir) as embedder:
        for pool in (None, "mean"):
            want = embedder.embed_sentences(SENTENCES, output="mixed", pool=pool, normalize=True)
            for gamma in (1e20, 1e-30):
                got = embedder.embed_sentences(SENTENCES, output="mixed", gamma=gamma, pool=pool, normalize=True)
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g, w, atol=1e-6, rtol=0, err_msg=f"{pool} {gamma}")


def test_an_output_of_a_huge_layer_number_is_an_input_error_that_does_not_echo_it_whole():
    from elmo_core.kinds import OutputMode

    with pytest.raises(InputError, match=r"got 'layer:9999.*\.\.\. \(5,008 characters\)$"):
        OutputMode.of("layer:" + "9" * 5000)  # int() would refuse over 4,300 digits with Python's own advice
    with pytest.raises(SettingError, match=r"^pool must be None or one of .*\.\.\. \(1,000,002 characters\)$"):
        VectorRequest(pool="x" * 1_000_000)
    assert OutputMode.of("layer:123456789").layer == 123456789


def test_the_library_refuses_what_it_cannot_read_twice_and_reads_a_mix_given_as_text(tiny_dir):
    """A generator was a TypeError after it had been consumed, None a TypeError; mix_weights "123"
    was read as the three weights 1, 2, 3 (the string's characters)."""
    with Embedder.from_files(tiny_dir) as embedder:
        for bad, says in (((s for s in SENTENCES), "got generator: pass list(...) of it"), (None, "got NoneType")):
            with pytest.raises(InputError, match=re.escape(says)):
                embedder.embed_sentences(bad)
        with pytest.raises(InputError, match="expected 3 values .* got 1"):
            embedder.embed_sentences(SENTENCES, output="mixed", mix_weights="123")
        as_text = embedder.embed_sentences(SENTENCES, output="mixed", mix_weights="0,1,2")
        as_numbers = embedder.embed_sentences(SENTENCES, output="mixed", mix_weights=(0.0, 1.0, 2.0))
        assert all(np.array_equal(a, b) for a, b in zip(as_text, as_numbers))
