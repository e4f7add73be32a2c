"""A non-finite loss, kept on the device with the step's other totals (``training.progress``), stops
the run at the next read of them, and before a checkpoint is written."""
from __future__ import annotations

import pytest

from training.errors import TrainingError
from training.trainer import Trainer

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus


def test_a_non_finite_loss_stops_the_run_at_the_read_before_a_checkpoint(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    opts = tiny_run(tmp_path, p, lr=1e30, max_steps=40, checkpoint_every=20)
    with pytest.raises(TrainingError, match=r"steps? [\d-]+: the loss is not finite; lower --lr"):
        Trainer(opts, log=lambda s: None).run()
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())
