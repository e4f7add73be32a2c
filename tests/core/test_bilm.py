"""The biLM against a straightforward float64 implementation, for every option, and its invariances."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_core import InputError, StatefulBiLM, batch_to_ids

from formats import load_bilm

from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir, tiny_options
from tests.reference_impl import ReferenceElmo

VARIANTS = {
    "default": TINY_OPTIONS,
    "no_skip": tiny_options(lstm__use_skip_connections=False),
    "tanh": tiny_options(char_cnn__activation="tanh"),
    "one_layer": tiny_options(lstm__n_layers=1),
    "three_layers": tiny_options(lstm__n_layers=3),
    "no_clipping": tiny_options(lstm__cell_clip=0, lstm__proj_clip=0),
    "no_highway": tiny_options(char_cnn__n_highway=0),
    "no_projection_size_change": tiny_options(lstm__dim=8, lstm__projection_dim=8),
}


def _run(model, sentences):
    with torch.inference_mode():
        out = model.run(torch.from_numpy(batch_to_ids(sentences)))
    return out.layers.numpy(), out.mask.numpy()


@pytest.mark.parametrize("path", ["model", "fast-plain-gemm", "fast-prepacked-gemm", "fast-fused"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_reference_for_every_option(name, path, tmp_path):
    """The model itself and its inference fast path (``inference.fast_path``) with both recurrent
    products (the tiny models take the plain one unless pre-packing is forced), and with fused
    steps (``inference.fused_lstm``; their kernels' functions uncompiled, as on a CPU by default:
    compiled, below and in test_fused_cell.py)."""
    from inference.fast_path import FastInference
    from inference.packed_gemm import packed_gemm_available

    if path == "fast-prepacked-gemm" and not packed_gemm_available(torch.device("cpu")):
        pytest.skip("this torch build has no oneDNN pre-packed linear (non-x86 CPU)")
    options = VARIANTS[name]
    model_dir = make_model_dir(tmp_path / name, options, seed=3, lstm_scale=2.0)
    model = load_bilm(model_dir)
    if path != "model":
        model.use_fast_path(FastInference(model, packed_min_weights=0 if path == "fast-prepacked-gemm" else 1 << 62,
                                          fused=path == "fast-fused"))
    ref = ReferenceElmo(options, str(model_dir / "weights.hdf5"))
    layers, mask = _run(model, SENTENCES)
    assert layers.shape == (len(SENTENCES), options["lstm"]["n_layers"] + 1, max(map(len, SENTENCES)),
                            2 * options["lstm"]["projection_dim"])
    for b, sent in enumerate(SENTENCES):
        want = ref.layers(sent)  # (L+1, n, 2P)
        # float32 model vs the float64 reference: fp32 rounding through the recurrence (measured ~1e-6)
        np.testing.assert_allclose(layers[b, :, : len(sent)], want, atol=1e-5, rtol=1e-5)
        assert mask[b].sum() == len(sent)
        assert not layers[b, :, len(sent):].any(), "padded positions must be zero"


@pytest.mark.parametrize("layout", ["cuda-kernels", "cpu-fused"])
@pytest.mark.parametrize("name", ["default", "no_clipping"])
def test_compiled_fused_steps_match_reference(name, layout, tmp_path):
    """The fused steps as they run on CUDA: kernels compiled by inductor (its CPU backend here); and
    a CPU's ``--layout fused``: the same kernels on packed oneDNN products (``inference.layout``)."""
    from elmo_core.fused_cell import FusedCell
    from inference.fast_path import FastInference
    from inference.packed_gemm import packed_gemm_available

    options = VARIANTS[name]
    model_dir = make_model_dir(tmp_path / name, options, seed=3, lstm_scale=2.0)
    model = load_bilm(model_dir)
    fast = FastInference(model, fused=True, kernels=FusedCell.compiled()) if layout == "cuda-kernels" else \
        FastInference(model, layout="fused")
    model.use_fast_path(fast)
    assert fast.lstm._use_packed() == (layout == "cpu-fused" and packed_gemm_available(torch.device("cpu")))
    ref = ReferenceElmo(options, str(model_dir / "weights.hdf5"))
    layers, _ = _run(model, SENTENCES)
    for b, sent in enumerate(SENTENCES):
        np.testing.assert_allclose(layers[b, :, : len(sent)], ref.layers(sent), atol=1e-5, rtol=1e-5)


def test_variants_really_differ(tmp_path):
    """Each option changes the output (so the parametrised test above exercises it)."""
    outs = {}
    for name in ("default", "no_skip", "tanh", "no_clipping", "no_highway"):
        model = load_bilm(make_model_dir(tmp_path / name, VARIANTS[name], seed=3, lstm_scale=2.0))
        outs[name] = _run(model, SENTENCES[:1])[0][0, -1]
    for name in ("no_skip", "tanh", "no_clipping", "no_highway"):
        assert np.abs(outs[name] - outs["default"]).max() > 1e-3, name
    P = TINY_OPTIONS["lstm"]["projection_dim"]
    assert np.abs(outs["default"][:, :P]).max() <= 3 * 2 + 1e-6  # clipped projection plus residual
    assert np.abs(outs["no_clipping"]).max() > 3.0


def test_batch_invariance(tiny_dir):
    model = load_bilm(tiny_dir)
    together, _ = _run(model, SENTENCES)
    for b, sent in enumerate(SENTENCES):
        alone, _ = _run(model, [sent])
        # a sentence in a batch vs alone: float32 sums in another order (GEMM blocking by batch shape)
        np.testing.assert_allclose(together[b, :, : len(sent)], alone[0], atol=1e-5, rtol=0)
    shuffled = [SENTENCES[i] for i in (4, 2, 0, 3, 1)]
    again, _ = _run(model, shuffled + [["extra", "padding", "row"] * 9])
    for k, i in enumerate((4, 2, 0, 3, 1)):
        n = len(SENTENCES[i])
        # the same rows in another batch order and shape: float32 sums in another order
        np.testing.assert_allclose(again[k, :, :n], together[i, :, :n], atol=1e-5, rtol=0)


def test_dedup_gives_the_same_token_layer(tiny_dir):
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES + [["the", "the", "The", "cat"]]))
    with torch.inference_mode():
        a = model.run(ids, dedup=True).layers
        b = model.run(ids, dedup=False).layers
    # the char-CNN on distinct tokens vs every token: the same per-row convolutions in other batch shapes
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_layer0_is_token_representation_twice(tiny_dir):
    model = load_bilm(tiny_dir)
    layers, _ = _run(model, SENTENCES[:2])
    P = TINY_OPTIONS["lstm"]["projection_dim"]
    np.testing.assert_array_equal(layers[:, 0, :, :P], layers[:, 0, :, P:])


def test_keep_boundaries(tiny_dir):
    model = load_bilm(tiny_dir)
    with torch.inference_mode():
        out = model.run(torch.from_numpy(batch_to_ids([["a", "b"], ["c"]])), keep_boundaries=True)
    assert out.layers.shape[2] == 4 and out.mask.sum(1).tolist() == [4, 3]
    bos = out.layers[0, 0, 0]
    torch.testing.assert_close(out.layers[1, 0, 0], bos)  # <S> has the same representation everywhere
    torch.testing.assert_close(out.layers[0, 0, 3], out.layers[1, 0, 2])  # and so has </S>


def test_stateful_carries_state_and_reset_clears_it(tiny_dir):
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES[:2]))
    st = StatefulBiLM(model)
    with torch.inference_mode():
        first = st.run(ids).layers
        second = st.run(ids).layers
        st.reset()
        third = st.run(ids).layers
    torch.testing.assert_close(first, third)
    assert (first[:, 1:] - second[:, 1:]).abs().max() > 1e-4
    torch.testing.assert_close(first[:, 0], second[:, 0])  # the token layer has no state


def test_non_left_aligned_ids_are_an_error(tiny_dir):
    model = load_bilm(tiny_dir)
    ids = batch_to_ids([["a", "b", "c"]])
    ids[0, 1] = 0
    with pytest.raises(InputError, match="left-aligned"):
        model.run(torch.from_numpy(ids))


def test_gradients_flow_in_training_mode(tiny_dir):
    model = load_bilm(tiny_dir).train()
    out = model.run(torch.from_numpy(batch_to_ids(SENTENCES)))
    out.layers.sum().backward()
    assert model.lstm.w_state.grad is not None and model.lstm.w_state.grad.abs().sum() > 0
    assert model.encoder.char_embed.grad[0].abs().sum() == 0  # the padding row never learns


@pytest.mark.parametrize("chunk_tokens", [1, 5])
def test_char_encoder_chunks_give_the_same_tokens_and_gradients(tiny_dir, chunk_tokens):
    """The encoder runs the tokens shortest first, a few at a time, each pass trimmed to its own
    longest token: the same values and gradients as one pass over all of them."""
    ids = torch.from_numpy(batch_to_ids(SENTENCES)).reshape(-1, 50)  # (N, C) including padding rows

    def run(chunk):
        encoder = load_bilm(tiny_dir).encoder.double()
        encoder.chunk_tokens = chunk
        with torch.no_grad():
            inference = encoder(ids)
        out = encoder(ids)
        out.pow(2).sum().backward()
        torch.testing.assert_close(inference, out.detach(), rtol=0, atol=0)
        return out.detach(), {k: p.grad for k, p in encoder.named_parameters()}

    assert ids.shape[0] > 5 * chunk_tokens
    chunked, chunked_grads = run(chunk_tokens)
    whole, whole_grads = run(ids.shape[0])
    # float64: chunking changes sum order only, ~1e-16 relative
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    for k in whole_grads:
        torch.testing.assert_close(chunked_grads[k], whole_grads[k], rtol=1e-10, atol=1e-12, msg=lambda m: f"{k}: {m}")


def test_the_inference_max_pool_takes_no_indices(tiny_dir):
    """Without autograd the encoder's max-pool is ``amax`` (8-16x faster on a CPU than ``max`` with
    its indices, the same values: the test above); with it, ``max``, whose gradient goes to one
    window as TF's does. A count of the ops each pass dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if isinstance(args[0], torch.Tensor) and args[0].is_floating_point():  # the scores' (the ids' lengths are reduced too)
                self.seen.add(str(func))  # e.g. aten.max.dim: values and indices
            return func(*args, **(kwargs or {}))

    encoder = load_bilm(tiny_dir).encoder
    ids = torch.from_numpy(batch_to_ids(SENTENCES)).reshape(-1, 50)  # (N, C)
    for grad, wanted, unwanted in [(False, "aten.amax.default", "aten.max.dim"),
                                   (True, "aten.max.dim", "aten.amax.default")]:
        with torch.set_grad_enabled(grad), Ops() as ops:
            encoder(ids)
        assert wanted in ops.seen and unwanted not in ops.seen, (grad, sorted(ops.seen))


def test_a_tokens_vector_does_not_depend_on_how_many_share_its_pass(tiny_dir):
    """fp32, bit for bit: a token encoded alone, with one or two others, or among many (a token
    cache's misses, the two boundaries) gets the same vector; MKL multiplies 1-3 rows in other
    kernels (1 ulp apart on a Zen 5), so the encoder never runs fewer than ``MIN_ROWS``."""
    from elmo_core.char_encoder import MIN_ROWS

    encoder = load_bilm(tiny_dir).encoder.eval()
    ids = torch.from_numpy(batch_to_ids(SENTENCES)).reshape(-1, 50)  # (N, C)
    with torch.no_grad():
        whole = encoder(ids)  # (N, P)
        for n in range(1, MIN_ROWS + 1):
            assert torch.equal(encoder(ids[:n]), whole[:n]), n
        assert torch.equal(encoder.boundary_embeddings(), encoder(torch.cat([encoder.boundary_ids, ids]))[:2])


def test_a_small_pass_does_not_import_torch_onnx(tiny_dir):
    """A pass of fewer than ``MIN_ROWS`` tokens asks whether an ONNX export traces it, without
    importing ``torch.onnx`` for that (a job's later batches, mostly cached, import nothing new)."""
    import subprocess
    import sys

    code = ("import sys, torch; from elmo_core.chars import batch_to_ids; from formats import load_bilm; "
            f"enc = load_bilm({str(tiny_dir)!r}).encoder.eval(); "
            "ids = torch.from_numpy(batch_to_ids([['a', 'b']])).reshape(-1, 50); "
            "torch.no_grad().__enter__(); enc(ids); print('torch.onnx' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-1] == "False", r.stdout + r.stderr[-2000:]


def test_unique_rows_is_exact_even_on_a_hash_collision():
    from elmo_core.bilm import unique_rows

    def check(x):
        uniq, inverse = unique_rows(x)
        assert torch.equal(uniq[inverse], x)
        assert sorted(map(tuple, uniq.tolist())) == sorted(map(tuple, torch.unique(x, dim=0).tolist()))
        host, host_inverse = unique_rows(x.numpy())  # a host plan's, in numpy: the same map or fallback, so the same order
        assert np.array_equal(host, uniq.numpy()) and np.array_equal(host_inverse, inverse.numpy())

    g = torch.Generator().manual_seed(0)
    check(torch.randint(0, 4, (500, 3), generator=g))  # many repeats
    check(torch.from_numpy(batch_to_ids(SENTENCES)).reshape(-1, 50))
    # Two distinct rows with the same hash (the map's coefficients are fixed per width): exact anyway.
    coeffs = torch.randint(-(2**62), 2**62, (2,), generator=torch.Generator().manual_seed(2), dtype=torch.long)
    collide = torch.tensor([[int(coeffs[1]), -int(coeffs[0])], [0, 0], [0, 0]])
    check(collide)
    assert unique_rows(collide)[0].shape == (2, 2)
