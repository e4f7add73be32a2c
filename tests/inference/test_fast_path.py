"""The inference fast path (``inference.fast_path.FastInference``) against the reference model it
plugs into (``BiLM.use_fast_path``): each of its steps computes what the model computes.

Every option of the model, with both recurrent products, is in tests/core/test_bilm.py; every
precision in tests/inference/test_precision.py; the CUDA-graph ``combine`` in test_cuda_graphs.py.
"""
from __future__ import annotations

import pytest
import torch

from elmo_core import batch_to_ids
from formats import load_bilm
from inference.fast_path import FastInference
from inference.packed_gemm import PackedLinear, packed_gemm_available
from inference.token_cache import TokenCache

from tests.helpers import SENTENCES


def _layers(model, ids, grad=False):
    with torch.enable_grad() if grad else torch.inference_mode():
        return model.run(ids).layers.detach()


def test_fast_path_equals_the_model_and_is_off_while_autograd_is_on(tiny_dir):
    """In-place steps, chunked input products and the packed mix vs the model's own recurrence
    (``LstmSequence``): the same fp32 maths, products grouped differently (1e-6, measured ~1e-7)."""
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    reference = _layers(model, ids)
    weights = torch.tensor([0.2, 0.3, 0.5])
    with torch.inference_mode():
        ref_mixed, _ = model.run_combined(ids, weights)
    fast = FastInference(model)
    model.use_fast_path(fast)
    calls, run_layer = [], fast.lstm.run_layer
    fast.lstm.run_layer = lambda *a: calls.append(a[0]) or run_layer(*a)  # counts the layers it runs
    torch.testing.assert_close(_layers(model, ids), reference, atol=1e-6, rtol=0)
    assert calls == [0, 1], "run did not go through the fast path"
    with torch.inference_mode():
        mixed, _ = model.run_combined(ids, weights)
    torch.testing.assert_close(mixed, ref_mixed, atol=1e-6, rtol=0)
    assert len(calls) == 4
    trained = _layers(model, ids, grad=True)  # autograd on: the model's own path, never the fast one
    assert len(calls) == 4
    torch.testing.assert_close(trained, reference, atol=0, rtol=0)


def test_token_cache_gives_the_same_vectors_and_follows_weight_changes(tiny_dir):
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    plain = _layers(model.use_fast_path(FastInference(model)), ids)
    cache = TokenCache(max_tokens=20)  # smaller than the vocabulary: some tokens never cached
    model.use_fast_path(FastInference(model, token_cache=cache))
    first, second = _layers(model, ids), _layers(model, ids)
    assert cache.hits > 0 and len(cache.index) == 20
    # cached char-CNN rows were computed in other batch shapes: fp32 rounding only
    torch.testing.assert_close(first, plain, atol=1e-6, rtol=0)
    torch.testing.assert_close(second, plain, atol=1e-6, rtol=0)
    with torch.no_grad():
        model.encoder.proj_bias.add_(1.0)
    changed = _layers(model, ids)
    assert (changed - plain).abs().max() > 1e-3, "the weight change must show"
    # as above: cached rows computed in another batch shape
    torch.testing.assert_close(changed, _layers(model.use_fast_path(None), ids), atol=1e-6, rtol=0)


def test_a_batch_whose_tokens_are_cached_runs_no_char_cnn(tiny_dir):
    """A fast path with a token cache encodes a batch's tokens and both boundaries once: run again,
    the batch reaches the char-CNN no more (the boundaries too come from the cache, not from the
    encoder again each batch). A count of the encoder's passes."""
    model = load_bilm(tiny_dir)
    model.use_fast_path(FastInference(model, token_cache=TokenCache(max_tokens=1000)))
    passes, forward = [], model.encoder.forward
    model.encoder.forward = lambda *a, **k: passes.append(1) or forward(*a, **k)  # every pass, called or not
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    first = _layers(model, ids)
    assert len(passes) >= 1
    passes.clear()
    torch.testing.assert_close(_layers(model, ids), first, atol=0, rtol=0)
    assert passes == []


@pytest.mark.parametrize("chunk_rows", [1, 3, 7])
def test_input_projection_chunks_give_the_same_layers(tiny_dir, chunk_rows):
    """The fast path computes W_x x a few whole steps at a time into a reused buffer: same numbers.

    Chunks smaller than one step (1, 3 rows: every step is its own chunk) and spanning several
    steps (7) are compared with one chunk for the whole batch.
    """
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    whole_rows = ids.shape[0] * (ids.shape[1] + 2)
    whole = _layers(model.use_fast_path(FastInference(model, chunk_rows=whole_rows)), ids)
    chunked = _layers(model.use_fast_path(FastInference(model, chunk_rows=chunk_rows)), ids)
    # input products in row chunks vs one GEMM: fp32 blocking differs
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)


def test_a_small_models_input_product_is_one_gemm_a_layer(tiny_dir, monkeypatch):
    """A count: with 4C small, a whole 4,096-token batch's input pre-activations fit in
    ``INPUT_CHUNK_FLOATS``, so each layer's input product is one GEMM per direction (on packed oneDNN
    weights in fp32 on a CPU: MKL's batched product of 512-row chunks ran at half its rate), not one
    per 512 rows."""
    from inference.fast_lstm import INPUT_CHUNK_FLOATS, INPUT_CHUNK_ROWS, FastLstm

    model = load_bilm(tiny_dir)
    gates = model.lstm.w_input.shape[-1]
    assert INPUT_CHUNK_FLOATS // gates >= 4096 > INPUT_CHUNK_ROWS
    words = [w for s in SENTENCES for w in s]
    sentences = [[words[(7 * i + j) % len(words)] for j in range(30)] for i in range(136)]  # 4,080 tokens
    ids = torch.from_numpy(batch_to_ids(sentences))
    reference = _layers(model, ids)
    products, layers, project = [], [], FastLstm.input_projection
    monkeypatch.setattr(FastLstm, "input_projection", lambda self, layer, dirs: (
        layers.append(layer), lambda x: products.append(x.shape) or project(self, layer, dirs)(x))[1])
    torch.testing.assert_close(_layers(model.use_fast_path(FastInference(model)), ids), reference, atol=1e-6, rtol=0)
    assert len(products) == len(layers) > 0 and all(rows > 4000 for _, rows, _ in products), products


def test_perplexity_runs_the_fast_path_and_leaves_the_model_as_it_was(tmp_path):
    """``elmo perplexity`` and a run's evaluations score through the inference recurrence; the
    language model's own path (the reference) gives the same perplexities to rounding."""
    from training.perplexity import perplexity
    from training.model import LanguageModel
    from training.vocab import Vocab
    from tests.helpers import TINY_OPTIONS
    from elmo_core import ElmoConfig

    words = sorted({w for s in SENTENCES for w in s})
    vocab = Vocab(["<S>", "</S>", "<UNK>"] + words)
    lm = LanguageModel(ElmoConfig.from_dict(TINY_OPTIONS), len(vocab)).initialise(0)
    corpus = tmp_path / "valid.txt"
    corpus.write_text("\n".join(" ".join(s) for s in SENTENCES) + "\n", encoding="utf-8")
    layers = []
    run_layer = FastInference.run_layer
    FastInference.run_layer = lambda self, *a: layers.append(a[0]) or run_layer(self, *a)
    try:
        fast = perplexity(lm, corpus, vocab, batch_size=2)
    finally:
        FastInference.run_layer = run_layer
    assert layers and lm.bilm.fast_path is None  # scored on the fast path, then unplugged
    with torch.no_grad():
        reference = perplexity.__wrapped__(lm, corpus, vocab, batch_size=2)  # the model's own recurrence
    assert fast["predictions"] == reference["predictions"] > 0
    for k in ("forward", "backward", "mean"):
        assert fast[k] == pytest.approx(reference[k], rel=1e-5), k  # fp32 sums grouped differently
    lm.train()

    def fail(sentences, predictions):
        raise KeyboardInterrupt  # a run stopped between batches

    with pytest.raises(KeyboardInterrupt):
        perplexity(lm, corpus, vocab, batch_size=2, progress=fail)
    assert lm.training and lm.bilm.fast_path is None  # as it was: training mode, no fast path


@pytest.mark.parametrize("path", ["plain", "prepacked", "fp16"])
def test_fast_steps_carry_a_start_state_and_return_each_rows_final_state(tiny_dir, path):
    """From a nonzero start state (``StatefulBiLM``'s use), every row's final (h, c) and layers
    through the fast steps equal the model's: each step's output is the next step's recurrent
    input and each row's last one its final state, rows of several lengths."""
    from inference.packed_gemm import packed_gemm_available

    if path == "prepacked" and not packed_gemm_available(torch.device("cpu")):
        pytest.skip("this torch build has no oneDNN pre-packed linear (non-x86 CPU)")
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    start = model.lstm.zero_state(ids.shape[0])
    gen = torch.Generator().manual_seed(0)
    start.h.copy_(torch.rand(start.h.shape, generator=gen) - 0.5)
    start.c.copy_(torch.rand(start.c.shape, generator=gen) - 0.5)
    with torch.inference_mode():
        want = model.run(ids, state=start)
        model.use_fast_path(FastInference(model, "fp16" if path == "fp16" else "fp32",
                                          packed_min_weights=0 if path == "prepacked" else 1 << 62))
        got = model.run(ids, state=start)
    tol = dict(atol=2e-2, rtol=0) if path == "fp16" else dict(atol=1e-6, rtol=0)
    torch.testing.assert_close(got.state.h, want.state.h, **tol)
    torch.testing.assert_close(got.state.c, want.state.c, **tol)
    torch.testing.assert_close(got.layers, want.layers, **tol)
    assert (got.state.h - start.h).abs().amax() > 1e-2, "the state did not move"


def test_a_layers_output_buffer_is_reused_by_its_thread_only(tiny_dir):
    """On a CPU each layer's output is written into one buffer batch after batch (no fresh
    multi-MB tensor a batch); a batch run by another thread gets its own; the vectors of batches
    of several sizes, run in turns, stay the model's."""
    import threading

    model = load_bilm(tiny_dir)
    batches = [torch.from_numpy(batch_to_ids(s)) for s in (SENTENCES, SENTENCES[:2], SENTENCES[1:])]
    weights = torch.tensor([0.2, 0.3, 0.5])
    with torch.inference_mode():
        want = [model.run_combined(ids, weights)[0] for ids in batches]
    fast = FastInference(model)
    model.use_fast_path(fast)
    xs = torch.zeros(2, 5, model.config.lstm.projection_dim)
    mine = fast.lstm._output(0, xs)  # held: another thread's buffer cannot take its memory
    first = mine.data_ptr()
    assert fast.lstm._output(0, xs[:, :3]).data_ptr() == first != fast.lstm._output(1, xs).data_ptr()
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(fast.lstm._output(0, xs).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != first
    with torch.inference_mode():
        for _ in range(2):
            for ids, w in zip(batches, want):
                torch.testing.assert_close(model.run_combined(ids, weights)[0], w, atol=1e-6, rtol=0)


def test_token_cache_lookup_gives_each_tokens_vector_and_forgets_a_failed_encode():
    """``lookup`` (``plan`` then ``fill``): misses encoded, hits from the store, a cache smaller
    than the tokens keeps the first; an ``encode`` that fails leaves no row claimed."""
    ids = torch.tensor([[3, 1], [4, 1], [5, 9], [2, 6], [3, 1]])  # (U, C), a repeated row too
    encode = lambda x: x.float() @ torch.tensor([[1.0, 0.5, 0.0], [2.0, 0.0, 1.0]])  # noqa: E731  (n, 3)
    cache = TokenCache(max_tokens=3)

    def failing(x):
        raise RuntimeError("char-CNN failed")

    with pytest.raises(RuntimeError):
        cache.lookup(ids, failing, [])
    assert cache.filled == 0 and not cache.index
    for _ in range(2):
        torch.testing.assert_close(cache.lookup(ids, encode, []), encode(ids), atol=0, rtol=0)
    assert cache.filled == 3 and cache.hits > 0


@pytest.mark.skipif(not packed_gemm_available(torch.device("cpu")), reason="needs oneDNN's packed products (mkldnn)")
def test_the_char_cnn_runs_on_packed_weights_where_the_lstm_does_and_gives_the_encoders_values(tiny_dir):
    """fp32 with the LSTM's products on packed oneDNN weights (``packed_min_weights=0``: the
    ``onednn`` layout's rule) runs the char-CNN's products there too, remade when the weights
    change; plain LSTM products (the rule's default for this model) and bf16 keep the encoder's
    own. Values: the same fp32 sums in another order (1e-6 relative; measured 4e-7 on values up to 1.7)."""
    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES)).flatten(0, 1)  # (B T, W) tokens
    assert FastInference(model)._char_products() is None
    assert FastInference(model, "bf16", packed_min_weights=0)._char_products() is None
    fast = FastInference(model, packed_min_weights=0)
    products = fast._char_products()
    assert isinstance(products.project.func, PackedLinear)
    assert all(isinstance(p.func, PackedLinear) for p in products.convs + products.highway)
    for _ in range(2):  # the second time with changed weights: packed again
        with torch.inference_mode():
            torch.testing.assert_close(fast._char_cnn(ids), model.encoder(ids), atol=1e-6, rtol=1e-6)
        with torch.no_grad():
            model.encoder.proj_weight.mul_(1.5)
            model.encoder.highway.weight.mul_(0.5)
    assert fast._char_products() is not products
