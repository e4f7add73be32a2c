"""The default batching: packed rows whose LSTM state resets at every sentence start."""
from __future__ import annotations

import torch

from elmo_core import ElmoConfig, LstmState
from training.data import BpttBatcher, SentenceStream
from training.model import LanguageModel, run_directions
from training.vocab import build_vocab

from tests.training.train_utils import TINY_LM_OPTIONS, sotu_sentences, write_corpus


def _batcher(tmp_path, reset=True, batch=4, unroll=10):
    p = write_corpus(tmp_path / "c.txt", [s[:k] for s, k in zip(sotu_sentences(limit=40), [3, 7, 12, 1, 25] * 8)])
    vocab = build_vocab(str(p), 1)
    return BpttBatcher(SentenceStream(p, None), vocab, batch, unroll, reset=reset), vocab


def _lm(vocab) -> LanguageModel:
    lm = LanguageModel(ElmoConfig.from_dict(TINY_LM_OPTIONS), len(vocab)).initialise(3).double().eval()
    return lm


def _reference(lm, batch, state):
    """Each row alone, one sentence piece at a time, from zero at each start (else the row's state)."""
    D, B, T, _ = batch.chars.shape
    x = lm.bilm.embed_tokens(batch.chars.reshape(D * B, T, -1), batch.mask[None].expand(D, B, T).reshape(D * B, T))
    x = x.view(D, B, T, -1)  # (2, B, T, P)
    top = torch.zeros(D, B, T, x.shape[-1], dtype=x.dtype)
    finals_h, finals_c = state.h.clone(), state.c.clone()
    for b in range(B):
        n = int(batch.mask[b].sum())
        cuts = [t for t in range(n) if batch.starts[b, t] or t == 0] + [n]
        h, c = state.h[:, :, b : b + 1], state.c[:, :, b : b + 1]
        for s, e in zip(cuts[:-1], cuts[1:]):
            if batch.starts[b, s]:
                h, c = torch.zeros_like(h), torch.zeros_like(c)
            out, fin = run_directions(lm.bilm.lstm, x[:, b : b + 1, s:e].transpose(1, 2), LstmState(h, c))
            top[:, b, s:e] = out[:, :, 0]
            h, c = fin.h, fin.c
        if n:
            finals_h[:, :, b : b + 1], finals_c[:, :, b : b + 1] = h, c
    return top, LstmState(finals_h, finals_c)


def test_packed_rows_equal_each_sentence_from_zero_state(tmp_path):
    batcher, vocab = _batcher(tmp_path)
    lm = _lm(vocab)
    state = lm.zero_state(4)
    state = LstmState(state.h.double(), state.c.double())
    resets = 0
    with torch.enable_grad():  # the training path (the fused recurrence)
        for _ in range(6):
            batch = batcher.next_batch()
            resets += int(batch.starts[:, 1:].sum())
            got, final = lm.top_layer(batch.chars, batch.mask, state, batch.starts)
            want, want_final = _reference(lm, batch, state)
            # float64: packing changes sum order only, ~1e-16 relative
            assert torch.allclose(got * batch.mask[None, :, :, None], want, atol=1e-12)
            assert torch.allclose(final.h, want_final.h, atol=1e-12) and torch.allclose(final.c, want_final.c, atol=1e-12)
            state = LstmState(final.h.detach(), final.c.detach())
    assert resets > 6  # sentences did start inside windows
    assert state.h.abs().max() > 0  # and a state was carried into the next window


def test_starts_mark_each_sentence_in_both_directions(tmp_path):
    batcher, vocab = _batcher(tmp_path, batch=2, unroll=7)
    batch = batcher.next_batch()
    eos, bos = (int(vocab.ids([w])[0]) for w in ("</S>", "<S>"))
    for b in range(2):
        for t in range(1, 7):
            if batch.mask[b, t]:  # a sentence starts right after the forward's </S> and the backward's <S> targets
                assert bool(batch.starts[b, t]) == (int(batch.targets[0, b, t - 1]) == eos)
                assert bool(batch.starts[b, t]) == (int(batch.targets[1, b, t - 1]) == bos)
    assert batch.starts[:, 0].all()  # the first window starts every row with a sentence
    stateful, _ = _batcher(tmp_path, reset=False)
    assert stateful.next_batch().starts is None
