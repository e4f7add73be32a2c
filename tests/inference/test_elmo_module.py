"""``inference.Elmo``: AllenNLP 2.10.1's ``Elmo`` module's representations (against the peer),
gradients, dropout, the L2 term, and the mix over precomputed layers."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core import batch_to_ids
from elmo_core.errors import InputError
from formats import load_bilm
from inference.elmo_module import Elmo, ElmoMix

ROOT = Path(__file__).resolve().parents[2]
PEER = Path("/tmp/peer-allennlp/bin/python")
ATOL = 1e-5  # AllenNLP's float32 LSTM vs ours: other kernels and sum orders on O(1) outputs
CASES = [  # AllenNLP's Elmo arguments; each case runs two batches through one module
    {"num_output_representations": 2, "do_layer_norm": False, "keep_sentence_boundaries": False,
     "scalar_mix_parameters": None},
    {"num_output_representations": 1, "do_layer_norm": True, "keep_sentence_boundaries": False,
     "scalar_mix_parameters": [0.1, -0.5, 1.2]},
    {"num_output_representations": 1, "do_layer_norm": True, "keep_sentence_boundaries": True,
     "scalar_mix_parameters": [-1.0, 0.3, 0.7]},
]


def _batches(fixture_dir: Path) -> list[list[list[str]]]:
    lists = json.loads((fixture_dir / "sentences.json").read_text())
    return [[lists[row][i].split() for row in range(3)] for i in range(2)]  # 2 batches of 3 sentences


def _ours(fixture_dir: Path, case: dict, stateful: bool) -> Elmo:
    return Elmo(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5", dropout=0.0, stateful=stateful,
                **case).eval()


@pytest.mark.slow
def test_same_representations_as_allennlps_elmo(fixture_dir, tmp_path):
    if not PEER.is_file():
        pytest.skip(f"AllenNLP peer venv absent ({PEER}); build it with scripts/setup_allennlp.sh (make test does)")
    batches = _batches(fixture_dir)
    spec = [{"options": str(fixture_dir / "options.json"), "weights": str(fixture_dir / "lm_weights.hdf5"),
             "batches": batches, **case} for case in CASES]
    (tmp_path / "cases.json").write_text(json.dumps(spec))
    subprocess.run([str(PEER), str(ROOT / "tests" / "peers" / "allennlp_elmo.py"), str(tmp_path / "cases.json"),
                    str(tmp_path / "out.npz")], check=True, capture_output=True, timeout=300)
    theirs = np.load(tmp_path / "out.npz")
    for c, case in enumerate(CASES):
        # AllenNLP's biLM is stateful: batch 1 starts from batch 0's final states. Ours matches it
        # with stateful=True on both batches, and stateless on the first (zero state) batch.
        stateful, stateless = _ours(fixture_dir, case, True), _ours(fixture_dir, case, False)
        for b, batch in enumerate(batches):
            runs = [stateful(batch)] + ([stateless(batch)] if b == 0 else [])
            for got in runs:
                np.testing.assert_array_equal(got["mask"].numpy(), theirs[f"c{c}_mask_{b}"])
                for k, rep in enumerate(got["elmo_representations"]):
                    np.testing.assert_allclose(rep.detach().numpy(), theirs[f"c{c}_rep_{b}_{k}"], atol=ATOL, rtol=0,
                                               err_msg=f"case {c} batch {b} representation {k}")
        if c == 0:  # the stateless second batch is what the sentences give alone, not AllenNLP's
            assert np.abs(stateless(batches[1])["elmo_representations"][0].detach().numpy()
                          - theirs["c0_rep_1_0"]).max() > 1e-3


def test_gradients_reach_the_mix_and_the_bilm_only_with_requires_grad(fixture_dir):
    batch = _batches(fixture_dir)[0]
    for requires_grad in (False, True):
        elmo = _ours(fixture_dir, {"num_output_representations": 2, "requires_grad": requires_grad}, False).train()
        out = elmo(batch)["elmo_representations"]
        (out[0].pow(2).sum() + out[1].sum()).backward()
        for mix in elmo.mix.mixes:
            assert mix.scalars.grad is not None and mix.scalars.grad.abs().sum() > 0
            assert mix.gamma.grad is not None and mix.gamma.grad.abs() > 0
        bilm_grads = [p.grad for p in elmo.bilm.parameters()]
        if requires_grad:
            assert all(g is not None for g in bilm_grads) and elmo.bilm.lstm.w_input.grad.abs().sum() > 0
        else:
            assert all(g is None for g in bilm_grads) and not any(p.requires_grad for p in elmo.bilm.parameters())
        assert not elmo.bilm.training  # train() leaves the biLM in eval mode


def test_fixed_mix_dropout_penalty_and_inputs(fixture_dir):
    batch = _batches(fixture_dir)[0]
    fixed = _ours(fixture_dir, {"num_output_representations": 1, "scalar_mix_parameters": [0.0, 1.0, 2.0]}, False)
    assert not any(p.requires_grad for p in fixed.parameters())
    ids = torch.from_numpy(batch_to_ids(batch))  # (3, T, 50)
    a = fixed(batch)["elmo_representations"][0]
    b = fixed(ids[None].expand(2, *ids.shape))  # (2, 3, T, 50): leading dims kept
    assert b["mask"].shape == (2, *ids.shape[:2])
    # the same rows with leading dims flattened: another batch shape, fp32 rounding only
    np.testing.assert_allclose(b["elmo_representations"][0][1].numpy(), a.numpy(), atol=1e-6, rtol=0)

    dropped = Elmo(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5", 1, dropout=0.5, l2_coefficient=0.01)
    dropped.mix.mixes[0].scalars.data = torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        train_out = dropped.train()(batch)["elmo_representations"][0]
        eval_out = dropped.eval()(batch)["elmo_representations"][0]
    kept = train_out != 0
    assert 0.3 < kept[eval_out != 0].float().mean() < 0.7  # about half the values dropped
    # inverted dropout scales by 1/(1-p) = 2 in fp32: one rounding per value
    np.testing.assert_allclose(train_out[kept].numpy(), 2 * eval_out[kept].numpy(), rtol=1e-5, atol=1e-6)
    assert dropped.regularization_penalty().item() == pytest.approx(0.01 * (0.25 + 1.0 + 4.0))
    with pytest.raises(InputError, match=r"expected character ids \(\.\.\., T, 50\)"):
        fixed(torch.zeros(3, 4, dtype=torch.long))


def test_elmo_mix_on_precomputed_layers_equals_the_module(fixture_dir):
    batch = _batches(fixture_dir)[0]
    params = [0.2, -0.3, 0.9]
    elmo = _ours(fixture_dir, {"num_output_representations": 1, "scalar_mix_parameters": params}, False)
    out = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5").run(torch.from_numpy(batch_to_ids(batch)))
    mix = ElmoMix(3, 1, dropout=0.0, scalar_mix_parameters=params)
    # the same scalar mix over the same layers, computed in two modules: a few ulp
    np.testing.assert_allclose(mix(out.layers, out.mask)[0].detach().numpy(),
                               elmo(batch)["elmo_representations"][0].numpy(), atol=1e-6, rtol=0)


def test_numpy_character_ids_are_accepted_and_other_inputs_named(tiny_dir):
    elmo = Elmo(tiny_dir / "options.json", tiny_dir / "weights.hdf5", 1, dropout=0.0).eval()
    batch = [["The", "cat", "sat", "."], ["Hi"]]
    ids = batch_to_ids(batch)  # numpy (2, 4, 50) int32, as the README's snippet passes it
    from_numpy, from_tokens = elmo(ids), elmo(batch)
    from_torch = elmo(torch.from_numpy(ids).long())
    for got in (from_numpy, from_torch):
        assert torch.equal(got["elmo_representations"][0], from_tokens["elmo_representations"][0])
        assert got["mask"].tolist() == [[True] * 4, [True, False, False, False]]
    with pytest.raises(InputError, match="integer character ids, got dtype float32"):
        elmo(ids.astype(np.float32))
    with pytest.raises(InputError, match="character ids are integers"):
        elmo(torch.from_numpy(ids).float())
    with pytest.raises(InputError, match="wrap one sentence as"):
        elmo(["The", "cat"])


def test_a_batch_without_tokens_gives_empty_answers_and_ids_out_of_range_are_named(tiny_dir):
    """An empty batch (or one of empty sentences) answers with zero-width tensors as the shapes say, not an
    IndexError; a character id outside the model's rows is an InputError, not torch's 'index out of range'."""
    elmo = Elmo(tiny_dir / "options.json", tiny_dir / "weights.hdf5", 2, dropout=0.0).eval()
    D = elmo.get_output_dim()
    assert batch_to_ids([]).shape == (0, 0, 50) and batch_to_ids([[], []]).shape == (2, 0, 50)
    for inputs, shape in (([], (0, 0)), ([[], []], (2, 0)), (batch_to_ids([]), (0, 0))):
        got = elmo(inputs)
        assert [tuple(r.shape) for r in got["elmo_representations"]] == [(*shape, D)] * 2
        assert tuple(got["mask"].shape) == shape and got["mask"].dtype == torch.bool
    kept = Elmo(tiny_dir / "options.json", tiny_dir / "weights.hdf5", 1, dropout=0.0, keep_sentence_boundaries=True)
    assert tuple(kept.eval()([[]])["elmo_representations"][0].shape) == (1, 2, D)
    ids = batch_to_ids([["The", "cat"]])
    for bad, value in ((300, "300"), (-1, "-1")):
        wrong = ids.copy()
        wrong[0, 1, 3] = bad
        with pytest.raises(InputError, match=f"character id {value} is outside 0..261"):
            elmo(wrong)
