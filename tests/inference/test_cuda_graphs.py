"""The CUDA-graph path: sentences laid in rows of one static shape (``inference.row_lstm``) and run a
window at a time (``inference.cuda_graphs.RowGraphs``), eagerly on the CPU (``capture=False``)
against the packed path and a float64 run of the same maths; capture and replay themselves are
tested on a GPU in tests/gpu/test_gpu.py."""
from __future__ import annotations

import copy

import pytest
import torch

from elmo_core import batch_to_ids
from elmo_core.errors import InputError
from formats import load_bilm
from inference.backends import TorchBackend
from inference.fast_path import FastInference
from inference.packed_gemm import packed_gemm_available
from inference.row_lstm import RowPlan, RowShape

from tests.helpers import SENTENCES, assert_as_accurate, make_model_dir, tiny_options


def _batches() -> list[list[list[str]]]:
    long = "the quick brown fox jumps over the lazy dog again and again".split()
    return [SENTENCES + [[], ["One"]], [long] * 9 + [["a", "b"]], [["x"]], [long[: k + 1] for k in range(11)]]


@pytest.mark.parametrize("options,precision,kernels", [
    ({}, "fp32", "compiled"),  # what runs on CUDA: inductor's kernels (its CPU backend here)
    ({}, "bf16", "eager"),
    ({"lstm__use_skip_connections": False, "lstm__n_layers": 3}, "fp32", "eager"),
    ({"lstm__use_skip_connections": False, "lstm__n_layers": 3}, "bf16", "eager"),
    ({"lstm__cell_clip": 0, "lstm__proj_clip": 0}, "fp32", "eager"),
    ({}, "fp32", "cpu-layout"),  # a CPU's --layout rows: compiled kernels on packed oneDNN products
    ({}, "bf16", "cpu-layout"),
])
def test_rows_give_the_packed_vectors(tmp_path, options, precision, kernels):
    """Rows of 4 x 3 steps: every batch crosses windows, sentences cross windows, the state is
    carried and zeroed where a sentence starts; both paths as accurate against float64."""
    from elmo_core.fused_cell import FusedCell

    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options(**options), lstm_scale=3.0)).eval()
    reference = copy.deepcopy(model.lstm).double()  # the float64 maths both paths compute
    packed = FastInference(model, precision)
    if kernels == "cpu-layout":
        rows = FastInference(model, precision, layout="rows", capture=False, rows=RowShape(4, 3))
        assert (rows.lstm.packed_products(0) is not None) == packed_gemm_available(torch.device("cpu"))
    else:
        rows = FastInference(model, precision, cuda_graphs=True, capture=False, rows=RowShape(4, 3),
                             kernels=FusedCell.compiled() if kernels == "compiled" else FusedCell.eager())
    weights = torch.linspace(0.2, 1.1, model.config.n_output_layers)
    with torch.inference_mode():
        for sentences in _batches():
            ids = torch.from_numpy(batch_to_ids(sentences))
            mask, lengths = model._mask(ids)
            x = model._with_boundaries(model.embed_tokens(ids, mask), lengths)  # (B, T+2, P): both paths' input
            exact = reference.forward_combined(x.double(), lengths + 2, weights.double(), slice(1, x.shape[1] - 1), mask)
            want, mask = model.use_fast_path(packed).run_combined(ids, weights)
            got, got_mask = model.use_fast_path(rows).run_combined(ids, weights)
            assert torch.equal(mask, got_mask)
            assert_as_accurate(got, want, exact, packed.dtype, model.lstm, x.shape[1])
            assert not got[~mask].any()
    graphs = rows.graphs
    assert graphs.shape == RowShape(4, 3) and graphs.captures == 0 and graphs.positions > 0


def test_a_plan_places_every_token_once_and_zeroes_the_state_at_each_start():
    lengths = [7, 2, 0, 5, 9, 1, 3]
    plan = RowPlan(lengths, 9, RowShape(3, 4), "cpu")
    N, flat_pad = sum(lengths), len(lengths) * 9
    assert plan.windows * 4 * 3 >= N and plan.tokens == N
    for d in range(2):
        real = plan.sources[d][plan.sources[d] < flat_pad]
        assert sorted(real.tolist()) == sorted(b * 9 + k for b, n in enumerate(lengths) for k in range(n))
        placed = plan.targets[d][plan.targets[d] < plan.windows * 12]
        assert sorted(placed.tolist()) == sorted(torch.nonzero(plan.sources[d] < flat_pad).squeeze(1).tolist())
    # the backward direction reads each sentence reversed in the same span
    for b, n in enumerate(lengths):
        fwd = [int(plan.targets[0, b * 9 + k]) for k in range(n)]
        bwd = [int(plan.targets[1, b * 9 + n - 1 - k]) for k in range(n)]
        assert fwd == bwd
        if n:  # its span is contiguous in its row: position s -> window s // T, step s % T
            s = [(p // 12) * 4 + (p % 12) // 3 for p in fwd]
            assert s == list(range(s[0], s[0] + n)) and len({p % 3 for p in fwd}) == 1
            assert not plan.keep[s[0], fwd[0] % 3]  # the state is zeroed at its first position
    assert int((~plan.keep).sum()) == sum(1 for n in lengths if n)  # and nowhere else
    assert plan.padded_fraction == pytest.approx(1 - N / (plan.windows * 12))


def test_dealing_longest_first_keeps_the_rows_even():
    lengths = [29, 31, 25, 40, 12, 33, 27, 30] * 64  # sotu-like sentences, a 16k-token batch
    shape = RowShape().for_batch(lengths)
    plan = RowPlan(lengths, 42, shape, "cpu")
    assert shape == RowShape(256, 8) and plan.windows == 8 and plan.padded_fraction <= 0.12


def test_a_batch_of_few_long_sentences_takes_fewer_rows():
    shape = RowShape(512, 16)
    assert shape.for_batch([226] * 20 + [150] * 200) == RowShape(128, 16)  # 512 rows: mostly padding
    assert shape.for_batch([30] * 4000) == RowShape(512, 16)  # enough tokens: every row
    assert shape.for_batch([5, 3]) == RowShape(8, 16)  # one window whatever the rows: the fewest
    assert RowShape() == RowShape(1024, 8)
    assert RowShape(4, 3).for_batch([7, 2]) == RowShape(4, 3)  # fewer than 8 rows: as given


def test_the_row_counts_a_batch_may_take_are_every_choice_of_for_batch():
    """What a server warms (``RowGraphs.warm``): every row count ``for_batch`` may choose, and
    none that batches of its sentences cannot reach."""
    shape = RowShape()
    assert shape.row_counts() == [1024, 512, 256, 128, 64, 32, 16, 8]
    assert shape.row_counts(most_sentences=100) == [128, 64, 32, 16, 8]
    assert shape.row_counts(most_sentences=1) == [8]
    chosen = {shape.for_batch([n] * k).rows for n in (1, 5, 30, 200) for k in (1, 7, 100, 1000, 5000)}
    assert chosen <= set(shape.row_counts()) and len(chosen) > 3


def test_cuda_graphs_need_a_cuda_device(tmp_path):
    with pytest.raises(InputError, match="cuda_graphs needs a CUDA device"):
        TorchBackend.from_files(make_model_dir(tmp_path / "m", tiny_options()), cuda_graphs=True)


def test_a_sentence_in_rows_does_not_depend_on_its_batch(tmp_path):
    """Stateless as the packed path: the state is zeroed where each sentence starts, so a sentence
    alone and among others (other rows, other windows, other row counts) gets the same vectors up
    to the products' summation order."""
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options(), lstm_scale=3.0)).eval()
    rows = FastInference(model, cuda_graphs=True, capture=False, rows=RowShape(8, 3))
    weights = torch.tensor([0.3, 0.3, 0.4])
    target = "the quick brown fox jumps over the lazy dog".split()
    crowd = [target[: k + 1] for k in range(8)] * 3
    with torch.inference_mode():
        alone, _ = model.use_fast_path(rows).run_combined(torch.from_numpy(batch_to_ids([target])), weights)
        among, _ = model.use_fast_path(rows).run_combined(torch.from_numpy(batch_to_ids(crowd + [target] + crowd)), weights)
    assert sorted(rows.graphs.windows) == [8]  # both ran in windows of 8 rows, the second in many windows
    got = among[len(crowd), : len(target)]
    torch.testing.assert_close(got, alone[0, : len(target)], rtol=0, atol=1e-6 * float(alone.abs().max()))


@pytest.mark.parametrize("rows", [8, 4, 16])
def test_every_input_of_the_fused_kernels_is_16_byte_aligned(tmp_path, rows):
    """A compiled CUDA kernel assumes its inputs 16-byte aligned where the first it met was, and
    copies every later input that is not before it runs: a window's keep rows of R = 8 bools put
    every other step's ``keep[t]`` 8 bytes off (one device copy every other step, the H200's 4.5
    kernels a step). Every tensor the kernels take, at every step, starts on 16 bytes."""
    from elmo_core.fused_cell import KERNELS, FusedCell

    offsets: set[int] = set()

    def recorded(fn):  # noqa: ANN001, ANN202
        def call(*args):  # noqa: ANN002, ANN202
            offsets.update(a.storage_offset() * a.element_size() % 16 for a in args if isinstance(a, torch.Tensor))
            return fn(*args)
        return call

    kernels = FusedCell(**{name: recorded(fn) for name, fn in KERNELS.items()})
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options())).eval()
    rows_path = FastInference(model, "fp32", cuda_graphs=True, capture=False, rows=RowShape(rows, 8), kernels=kernels)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    with torch.inference_mode():
        model.use_fast_path(rows_path).run_combined(ids, torch.full((model.config.n_output_layers,), 0.5))
    assert rows_path.graphs.positions > 0 and offsets == {0}
