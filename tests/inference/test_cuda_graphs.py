"""The CUDA-graph path's bucketed, padded recurrence (``inference.cuda_graphs.GraphedStack``), run
eagerly on the CPU (``capture=False``) against ``BiLstmStack.forward_combined``; capture and replay
themselves are tested on a GPU in tests/gpu/test_gpu.py."""
from __future__ import annotations

import copy

import pytest
import torch

from elmo_core import batch_to_ids
from elmo_core.errors import InputError
from elmo_core.lstm import Packing
from formats import load_bilm
from inference.backends import TorchBackend
from inference.cuda_graphs import GraphedStack, bucket_size
from inference.fast_path import FastInference

from tests.helpers import SENTENCES, assert_as_accurate, make_model_dir, tiny_options


def _batches() -> list[list[list[str]]]:
    long = "the quick brown fox jumps over the lazy dog again and again".split()
    return [SENTENCES + [[], ["One"]], [long] * 9 + [["a", "b"]], [["x"]], [long[: k + 1] for k in range(11)]]


@pytest.mark.parametrize("options", [{}, {"lstm__use_skip_connections": False, "lstm__n_layers": 3}])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_padded_buckets_give_the_packed_vectors(tmp_path, options, precision):
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options(**options), lstm_scale=3.0)).eval()
    reference = copy.deepcopy(model.lstm).double()  # the float64 maths both paths compute
    packed, bucketed = FastInference(model, precision), FastInference(model, precision, cuda_graphs=True, capture=False)
    graphed = bucketed.graphs
    weights = torch.linspace(0.2, 1.1, model.config.n_output_layers)
    model.use_fast_path(packed)
    with torch.inference_mode():
        for sentences in _batches():
            ids = torch.from_numpy(batch_to_ids(sentences))
            mask, lengths = model._mask(ids)
            x = model._with_boundaries(model.embed_tokens(ids, mask), lengths)  # (B, T+2, P): both paths' input
            exact = reference.forward_combined(x.double(), lengths + 2, weights.double(), slice(1, x.shape[1] - 1), mask)
            want, mask = model.use_fast_path(packed).run_combined(ids, weights)
            got, got_mask = model.use_fast_path(bucketed).run_combined(ids, weights)
            assert torch.equal(mask, got_mask)
            # the buckets pad rows and steps, so the products run in other shapes: as accurate, not equal
            assert_as_accurate(got, want, exact, packed.dtype, model.lstm, x.shape[1])
            assert not got[~mask].any()  # the padding ran every step, and is zero in what comes back
    buckets = {(bucket_size(len(s)), bucket_size(max(map(len, s)) + 2)) for s in _batches()}  # +2: <S>, </S>
    assert set(graphed.graphs) == buckets and graphed.captures == 0


def test_without_keep_the_padding_is_masked(tmp_path):
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options(), lstm_scale=3.0)).eval()
    x = torch.randn(5, 9, model.config.lstm.projection_dim)  # (B, T, P)
    lengths = torch.tensor([9, 2, 5, 3, 7])
    x[torch.arange(9)[None, :] >= lengths[:, None]] = 0
    x[:, 0] = x[0, 0].clone()  # framed as forward_combined expects: every row starts with <S> ...
    x[torch.arange(5), lengths - 1] = x[0, 8].clone()  # ... and ends with </S>
    w = torch.tensor([0.3, 0.3, 0.4])
    with torch.inference_mode():
        want = model.lstm.forward_combined(x, lengths, w, slice(1, 8))
        got = GraphedStack(model.lstm, capture=False)(x, lengths, w, slice(1, 8))
        exact = copy.deepcopy(model.lstm).double().forward_combined(x.double(), lengths, w.double(), slice(1, 8))
    valid = (torch.arange(1, 8)[None, :] < (lengths - 1)[:, None])  # forward_combined also zeroes the last step
    assert_as_accurate(got[valid], want[valid], exact[valid], torch.float32, model.lstm, x.shape[1])
    assert not got[torch.arange(1, 8)[None, :] >= lengths[:, None]].any()


def test_the_graph_cache_is_bounded_least_recently_used_first(tmp_path):
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options())).eval()
    graphed = GraphedStack(model.lstm, capture=False, max_graphs=2)
    w = torch.full((3,), 1 / 3)
    with torch.inference_mode():
        for b, t in [(4, 5), (20, 5), (4, 5), (4, 30)]:  # buckets (8, 8), (24, 8), (8, 8), (8, 32)
            graphed(torch.zeros(b, t, model.config.lstm.projection_dim), torch.full((b,), t), w)
    assert list(graphed.graphs) == [(8, 8), (8, 32)]
    assert graphed.memory_bytes() > 0


def test_buckets_round_up_by_at_most_an_eighth_from_64():
    sizes = [bucket_size(n) for n in range(1, 5000)]
    assert all(s >= n for n, s in zip(range(1, 5000), sizes))
    assert all(s <= n * 1.125 for n, s in zip(range(1, 5000), sizes) if n >= 64)
    assert sizes == sorted(sizes)  # monotone: a longer batch never lands in a smaller bucket
    assert len(set(sizes)) < 100  # few distinct buckets, so few graphs


def test_every_step_packing_is_static():
    pack = Packing(torch.tensor([3, 7, 1, 0]), 8, shared_first=True, every_step=True)
    assert not pack.shared_first and pack.steps == [(4 * t, 4) for t in range(8)]
    assert pack.sources.shape == (2, 32)


def test_cuda_graphs_need_a_cuda_device(tmp_path):
    with pytest.raises(InputError, match="cuda_graphs needs a CUDA device"):
        TorchBackend.from_files(make_model_dir(tmp_path / "m", tiny_options()), cuda_graphs=True)
