"""``elmo train --compile``: the recurrence with fused, compiled steps (``elmo_core.fused_sequence``, as on
CUDA) gives the eager run's weights."""
from __future__ import annotations

import pytest

from training import checkpoint as ck
from training.trainer import train

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus, write_options

STEPS = 2


def _model_tensors(run_dir):
    ckpt = run_dir / "checkpoints"
    tensors, _ = ck.read(ck.main_path(ckpt, ck.latest_step(ckpt, 1)))
    return {k: v for k, v in tensors.items() if k.startswith("model.")}


@pytest.mark.slow
def test_compiled_training_steps_equal_eager(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=30))
    options = write_options(tmp_path / "nodrop.json", dropout=0.0)  # same RNG use in both runs
    kw = dict(max_steps=STEPS, options=str(options), seed=1)
    train(tiny_run(tmp_path, p, out="eager", **kw), log=lambda s: None)
    train(tiny_run(tmp_path, p, out="compiled", compile=True, **kw), log=lambda s: None)
    eager, compiled = _model_tensors(tmp_path / "eager"), _model_tensors(tmp_path / "compiled")
    assert set(eager) == set(compiled)
    worst = max(float((eager[k] - compiled[k]).abs().max()) for k in eager)
    # the fused kernels round sigmoid / tanh by their own vectorized code: fp32 rounding over a few steps
    assert worst <= 1e-5, worst
