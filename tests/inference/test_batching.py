"""Batches planned for the static rows (``inference.batching``, ``BatchPolicy.rows``: the rows
layout CUDA runs): every token placed once, in input order, with the vectors of the reference
path; the rows the batches are dealt into end within a step of each other."""
from __future__ import annotations

import math

import numpy as np
import pytest

from inference.backends import TorchBackend
from inference.batching import ROW_GRID_SLACK, BatchPolicy, plan_batches
from inference.embedder import Embedder
from inference.fast_path import FastInference
from inference.row_lstm import RowShape, _deal

from tests.helpers import SENTENCES, make_model_dir, tiny_options


def _sentences(n: int, seed: int = 0) -> list[list[str] | None]:
    """Lengths spread as text's are (many short, a long tail), nulls and empty rows among them."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.geometric(1 / 12, n), 60)
    rows: list[list[str] | None] = [[f"w{i}_{k}" for k in range(n)] for i, n in enumerate(lengths)]
    rows[3], rows[7] = None, []
    return rows


def _positions(plan, shape: RowShape) -> tuple[int, int]:
    """(positions the rows path runs, tokens with their boundaries) over ``plan``'s batches, each
    batch's rows as ``RowGraphs`` takes them (``RowShape.for_batch``, ``row_lstm._deal``)."""
    positions = tokens = 0
    for b in plan.batches:
        lens = [len(t) + 2 for t in b.tokens]
        rows = shape.for_batch(lens)
        _, _, fill = _deal(lens, rows.rows)
        positions += math.ceil(max(fill) / shape.steps) * shape.steps * rows.rows
        tokens += sum(lens)
    return positions, tokens


def test_rows_batches_place_every_token_once_and_fill_their_rows():
    rows, shape = _sentences(3000), RowShape(64, 4)
    policy = BatchPolicy(max_sentence_length=40, window_context=4, max_tokens_per_batch=4096, rows=shape)
    plan = plan_batches(rows, policy)
    dest = np.concatenate([b.gather_index()[2] for b in plan.batches])
    assert np.array_equal(np.sort(dest), np.arange(plan.tokens))  # each token's vector placed exactly once
    for b in plan.batches:
        lens = [len(t) for t in b.tokens]
        assert lens == sorted(lens, reverse=True)
        assert len(lens) * lens[0] <= ROW_GRID_SLACK * policy.max_tokens_per_batch  # the input grid's bound
    positions, tokens = _positions(plan, shape)
    rectangles = plan_batches(rows, BatchPolicy(40, 4, 4096))
    before, _ = _positions(rectangles, shape)
    assert 1 - tokens / positions < 0.05 < 1 - tokens / before, (tokens / positions, tokens / before)
    capped = plan_batches(rows, policy, max_rows=50)
    assert max(len(b.tokens) for b in capped.batches) <= 50
    assert np.array_equal(np.sort(np.concatenate([b.gather_index()[2] for b in capped.batches])),
                          np.arange(plan.tokens))


def test_rows_batches_give_the_reference_vectors(tmp_path):
    """The rows path (its windows run eagerly on the CPU, as CUDA replays them) over batches planned
    for its rows, against the packed path over length-sorted rectangles: the same vectors for every
    sentence, in input order (fp32, to the products' summation order)."""
    model_dir = make_model_dir(tmp_path / "m", tiny_options(), lstm_scale=3.0)
    reference = Embedder(TorchBackend.from_files(model_dir), policy=BatchPolicy(12, 2, 96))
    rows_backend = TorchBackend.from_files(model_dir)
    rows_backend.fast = FastInference(rows_backend.model, "fp32", rows_backend.fast.token_cache, cuda_graphs=True,
                                      capture=False, rows=RowShape(8, 4))
    rows_backend.model.use_fast_path(rows_backend.fast)
    policy = BatchPolicy(12, 2, 96, rows=RowShape(8, 4))
    planned = Embedder(rows_backend, policy=policy)
    sentences = [s or [] for s in _sentences(120, seed=1)] + SENTENCES
    plan = plan_batches(sentences, policy)
    assert any(len(b.tokens[0]) > 3 * len(b.tokens[-1]) for b in plan.batches)  # long and short pieces mixed
    for output in ("all", "mixed"):
        want = reference.embed_sentences(sentences, output=output)
        got = planned.embed_sentences(sentences, output=output)
        assert [g.shape for g in got] == [w.shape for w in want]
        scale = max(float(np.abs(w).max()) for w in want if w.size)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale)
    pooled = planned.embed_sentences(sentences, pool="mean")  # a sentence's windows joined across batches
    for p, w in zip(pooled, reference.embed_sentences(sentences, pool="mean")):
        assert (p is None) == (w is None)
        if p is not None:
            np.testing.assert_allclose(p, w, rtol=0, atol=1e-5 * scale)
    assert rows_backend.fast.graphs.positions > 0 and rows_backend.fast.graphs.captures == 0


@pytest.mark.parametrize("layout,rows", [("rows", 1024), (None, None)])
def test_a_cuda_run_plans_its_batches_for_the_rows_layout(layout, rows):
    from elmo_core import ElmoConfig
    from inference.layout import Layout
    from inference.model_run import _batch_budget
    from pipelines.options import EmbedOptions

    config = ElmoConfig.from_dict(tiny_options())
    budget = _batch_budget("cuda", config, True, Layout(layout, "") if layout else None)
    assert budget.rows == rows and budget.policy().rows == (RowShape(rows) if rows else None)
    assert _batch_budget("cpu", config, False, Layout("packed", "")).rows is None  # a CPU's batches: rectangles
    opts = EmbedOptions(max_tokens_per_batch=budget.tokens)
    assert opts.policy(budget.rows).rows == budget.policy().rows
