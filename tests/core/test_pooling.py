"""Sentence vectors: masked mean and max pooling, alone and through the Embedder, with rows of
different lengths (and an empty one) in one batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_core import InputError, pool_tokens
from elmo_core.pooling import pool_ragged
from inference import Embedder
from tests.helpers import SENTENCES


def test_pooling_ignores_padding():
    x = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [100.0, 100.0]],  # row 0: 2 tokens, then padding
                      [[-5.0, 6.0], [-100.0, 100.0], [-100.0, 100.0]],  # row 1: 1 token
                      [[7.0, 7.0], [7.0, 7.0], [7.0, 7.0]]])  # row 2: no token
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    mean, mx = pool_tokens(x, mask, "mean"), pool_tokens(x, mask, "max")
    torch.testing.assert_close(mean[:2], torch.tensor([[2.0, 1.0], [-5.0, 6.0]]))
    torch.testing.assert_close(mx[:2], torch.tensor([[3.0, 4.0], [-5.0, 6.0]]))
    assert mean[2].isnan().all() and mx[2].isnan().all()
    with pytest.raises(InputError, match="pool must be one of"):
        pool_tokens(x, mask, "sum")


@pytest.mark.parametrize("trailing", [(4,), (3, 4)])  # (D,) or (L+1, D) per token
@pytest.mark.parametrize("pool", ["mean", "max"])
def test_ragged_rows_pool_as_the_padded_reference(trailing, pool):
    lengths = np.array([3, 0, 1, 5, 0, 2])
    rng = np.random.default_rng(0)
    flat = rng.standard_normal((lengths.sum(),) + trailing).astype(np.float32)  # (N, ...)
    padded = np.zeros((len(lengths), lengths.max()) + trailing, np.float32)  # (R, T, ...)
    mask = np.zeros((len(lengths), lengths.max()), bool)  # (R, T)
    for r, (a, n) in enumerate(zip(np.cumsum(lengths) - lengths, lengths)):
        padded[r, :n], mask[r, :n] = flat[a:a + n], True
    want = pool_tokens(torch.from_numpy(padded), torch.from_numpy(mask), pool).numpy()
    got = pool_ragged(flat, lengths, pool)
    assert got.shape == want.shape and got.dtype == np.float32
    # fp32 sums of <= 5 values in two orders (reduceat vs masked torch sum): a few ulp
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
    assert np.isnan(got[[1, 4]]).all()
    with pytest.raises(InputError, match="pool must be one of"):
        pool_ragged(flat, lengths, "sum")


@pytest.mark.parametrize("output", ["mixed", "all"])
@pytest.mark.parametrize("pool", ["mean", "max"])
def test_embedder_pools_each_sentence_as_alone(tiny_dir, output, pool):
    emb = Embedder.from_files(tiny_dir)
    sents = SENTENCES + [[]]
    tokens = emb.embed_sentences(sents, output=output)  # per sentence: (T, D) or (L+1, T, D)
    pooled = emb.embed_sentences(sents, output=output, pool=pool, batch_size=3)  # mixed lengths in a batch
    reduce = np.mean if pool == "mean" else np.max
    for sent, tok, got in zip(sents, tokens, pooled):
        if not sent:
            assert got is None
            continue
        want = reduce(tok, axis=-2)  # over the sentence's tokens only
        assert got.shape == want.shape and got.dtype == np.float32
        # fp32 mean over T tokens in two orders (reduceat vs torch): ~log2(T) ulp relative
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
