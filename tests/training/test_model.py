"""The biLM objective: LSTM wiring against the inference biLM, the sampled softmax, and learning."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from elmo_core import ElmoConfig, batch_to_ids
from training.data import SentenceBatcher, SentenceStream
from training.perplexity import perplexity
from training.model import LanguageModel
from training.objective import Candidates, LogUniformSampler, full_softmax_nll, sampled_softmax_nll
from training.trainer import Trainer
from training.vocab import Vocab, build_vocab

from tests.training.train_utils import TINY_LM_OPTIONS, sotu_sentences, tiny_run, write_corpus, write_options


def test_training_directions_match_the_inference_bilm(tmp_path):
    """Forward output at input i and backward output at reversed input j are the biLM's top layer."""
    sents = [["The", "cat", "sat", "."], ["Hi"]]
    p = write_corpus(tmp_path / "c.txt", sents)
    lm = LanguageModel(ElmoConfig.from_dict(TINY_LM_OPTIONS), 10).initialise(seed=4).eval()
    batch = SentenceBatcher(SentenceStream(p), Vocab(["<S>", "</S>", "<UNK>"]), 2).next_batch()
    with torch.no_grad():
        top, _ = lm.top_layer(batch.chars, batch.mask, None)  # (2, B, T, P)
        ref = lm.bilm.run(torch.from_numpy(batch_to_ids(sents)), keep_boundaries=True).layers[:, -1]  # (B, T+2, 2P)
    P = lm.config.lstm.projection_dim
    for b, s in enumerate(sents):
        n = len(s)
        # the training recurrence vs the inference stack, both fp32 on a tiny model: products grouped differently
        torch.testing.assert_close(top[0, b, : n + 1], ref[b, : n + 1, :P], rtol=0, atol=1e-6)
        # backward input j is original position n+1-j (</S> first): its output predicts position n-j
        torch.testing.assert_close(top[1, b, : n + 1], ref[b, 1 : n + 2, P:].flip(0), rtol=0, atol=1e-6)


def test_log_uniform_sampler_distinct_and_expected_counts():
    s = LogUniformSampler(1000, seed=1)
    p = s.probability(torch.arange(1000))
    # float64 probabilities: the sum's rounding is ~V * 1e-16
    assert abs(float(p.sum()) - 1.0) < 1e-12 and bool((p[:-1] > p[1:]).all())
    c = s.sample(100)
    assert c.ids.numel() == 100 == c.ids.unique().numel() and c.tries >= 100
    q = s.expected_count(c.ids, 100, c.tries).double()
    np.testing.assert_allclose(q, -np.expm1(c.tries * np.log1p(-p[c.ids].numpy())), rtol=1e-6)
    # the empirical inclusion rate of ids 0 and 5 matches the mean expected count (std ~0.02 here)
    for k in (0, 5):
        hits, expected = 0, 0.0
        for _ in range(400):
            c = s.sample(20)
            hits += int((c.ids == k).any())
            expected += float(s.expected_count(torch.tensor([k]), 20, c.tries)[0])
        assert abs(hits / 400 - expected / 400) < 0.08, (k, hits / 400, expected / 400)


def test_sampled_softmax_matches_tensorflow_formula():
    torch.manual_seed(0)
    V, P, N = 50, 6, 7
    h, w, b = torch.randn(N, P, dtype=torch.float64), torch.randn(V, P, dtype=torch.float64), torch.randn(V, dtype=torch.float64)
    y = torch.tensor([0, 1, 3, 3, 10, 40, 2])
    sampler = LogUniformSampler(V, seed=2)
    cand = Candidates(torch.tensor([3, 0, 17, 5]), tries=6)
    got = sampled_softmax_nll(h, y, w, b, cand, sampler)
    lq = lambda ids: torch.log(sampler.expected_count(ids, 4, 6).double())  # noqa: E731
    for i in range(N):
        logits = [h[i] @ w[y[i]] + b[y[i]] - lq(y[i : i + 1])[0]]
        logits += [h[i] @ w[c] + b[c] - lq(torch.tensor([c]))[0] for c in cand.ids.tolist() if c != int(y[i])]
        want = torch.logsumexp(torch.stack(logits), 0) - logits[0]
        # fp32 loss (a log-sum-exp over V logits) vs float64: ~1e-6 relative at O(1) losses
        assert abs(float(got[i]) - float(want)) < 1e-5
    full = full_softmax_nll(h, y, w, b, chunk=3)
    torch.testing.assert_close(full, torch.nn.functional.cross_entropy(h @ w.T + b, y, reduction="none"))


def _unigram_perplexity(train_sents, eval_sents, vocab):
    counts = Counter(t for s in train_sents for t in vocab.ids(s + ["</S>"]).tolist())
    total = sum(counts.values())
    nll = [-math.log(counts[t] / total) for s in eval_sents for t in vocab.ids(s + ["</S>"]).tolist()]
    return math.exp(sum(nll) / len(nll))


def _steps(trainer, n):
    losses = []
    for _ in range(n):
        sums, count = trainer.train_step(trainer.batcher.next_batch())
        trainer.progress.step += 1  # as the loop does: the lr schedule reads it
        losses.append(float(sums.sum()) / (2 * count))
    return losses


def test_loss_decreases_with_the_original_adagrad(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    opts = tiny_run(tmp_path, p, batch_size=8, unroll=10, recipe="bilm-tf")
    trainer = Trainer(opts, log=lambda s: None)  # sampled softmax, sparse Adagrad on its rows
    assert isinstance(trainer.optimizer, torch.optim.Adagrad) and trainer.sampler is not None
    assert trainer.sparse is not None and trainer.sparse.optimizer == "adagrad"
    losses = _steps(trainer, 60)
    assert np.mean(losses[-15:]) < np.mean(losses[:10]) - 0.2, (losses[:10], losses[-15:])


def test_trained_tiny_model_beats_unigram_perplexity(tmp_path):
    sents = sotu_sentences(limit=60)
    p = write_corpus(tmp_path / "train.txt", sents)
    opts = tiny_run(tmp_path, p, batch_size=8, unroll=10, optimizer="adam", lr=0.01)
    opts.options = str(write_options(tmp_path / "full.json", n_negative_samples_batch=100000, dropout=0.0))
    trainer = Trainer(opts, log=lambda s: None)
    assert trainer.sampler is None  # more negatives than words: the full softmax
    _steps(trainer, 120)
    vocab = build_vocab(p, min_count=1)
    ppl = perplexity(trainer.lm, p, vocab)
    unigram = _unigram_perplexity(sents, sents, vocab)
    assert ppl["forward"] < 0.8 * unigram and ppl["backward"] < 0.8 * unigram, (ppl, unigram)
    # float64 exp/log identity: exact up to ~1e-15 relative
    assert abs(ppl["mean"] - math.sqrt(ppl["forward"] * ppl["backward"])) < 1e-6 * ppl["mean"]


def test_bf16_autocast_step_runs(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=20))
    trainer = Trainer(tiny_run(tmp_path, p, precision="bf16"), log=lambda s: None)
    losses = _steps(trainer, 3)
    assert all(math.isfinite(x) for x in losses) and trainer.state.h.dtype == torch.float32
    assert trainer.lm.softmax_w.dtype == torch.float32  # autocast: parameters stay fp32
