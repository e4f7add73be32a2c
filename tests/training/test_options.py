"""Numbers `elmo train` (and `default-model`, `sotu-corpus`, `perplexity`) take, refused where the
run's record is made (``TrainOptions``) with the flag named, before RUN_DIR is created (issue 54,
B2 and C3): values that would make a useless model (--batch-size -1, --max-vocab 0), fall back to a
default (--batch-size 0, --seed -1), or end in a traceback or a NaN loss after the run directory is
written (--lr 1e308, --max-minutes nan, --seed 2**66). --checkpoint-every 0 is a setting of its own
(no checkpoint before the last step), said in its help and its error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core import ElmoConfig
from elmo_core.errors import SettingError
from tests.helpers import run_cli
from training.perplexity import perplexity
from training.model import LanguageModel
from training.options import TrainOptions
from training.vocab import Vocab

from .train_utils import TINY_LM_OPTIONS, sotu_sentences, write_corpus, write_options


@pytest.fixture
def train_args(tmp_path: Path) -> list[object]:
    corpus = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    return ["train", "--text", corpus, "--options", write_options(tmp_path / "tiny.json"), "--out",
            tmp_path / "run", "--max-steps", "2", "--threads", "1", "--no-tensorboard", "--min-count", "1",
            "--checkpoint-every", "0"]


@pytest.mark.parametrize("flags, named", [
    (["--batch-size", "-1"], "--batch-size must be a positive integer (at most 2147483647; left out: options.json's "
                             "batch_size), got -1"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--unroll", "0"], "--unroll must be a positive integer"),
    (["--max-minutes", "-1"], "--max-minutes must be a finite number in (0, 10000000] (left out: no time limit)"),
    (["--max-minutes", "nan"], "--max-minutes must be a finite number"),
    (["--max-vocab", "0"], "--max-vocab must be an integer from 4 to 2147483647"),
    (["--lr", "inf"], "--lr must be a finite number in [0, 3.40282e+38] (left out: the recipe's), got inf"),
    (["--lr", "1e308"], "--lr must be a finite number"),
    (["--lr-final", "nan"], "--lr-final must be a finite number in [0, 1]"),
    (["--epochs", "-1"], "--epochs must be a positive integer"),
    (["--checkpoint-every", "-1"], "--checkpoint-every must be an integer from 0 to 2147483647 (0: none before the "
                                   "last step)"),
    (["--min-count", "-1"], "--min-count must be a positive integer"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 2147483647, got -1"),
    (["--seed", "99999999999999999999"], "--seed must be an integer from 0 to 2147483647"),
    (["--log-every", "0"], "--log-every must be a positive integer"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints must be a positive integer"),
    (["--max-tokens", "0"], "--max-tokens must be a positive integer"),
    (["--shuffle-buffer", "-1"], "--shuffle-buffer must be an integer from 0 to 2147483647 (0: corpus order)"),
    (["--final-valid-sentences", "-1"], "--final-valid-sentences must be a positive integer"),
])
def test_train_refuses_each_bad_number_before_the_run_directory_exists(train_args, tmp_path, flags, named):
    r = run_cli(*train_args, *flags)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, named", [
    (["--max-minutes", "nan"], "--max-minutes must be a finite number"),
    (["--max-minutes", "-1"], "--max-minutes must be a finite number"),
    (["--max-minutes", "0.01", "--seed", "-1"], "--seed must be an integer from 0 to 2147483647, got -1"),
])
def test_default_model_refuses_bad_flags_before_writing(tmp_path, flags, named):
    r = run_cli("default-model", "--out", tmp_path / "model", "--work-dir", tmp_path / "work", *flags)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "model").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("every", ["0", "1", "100000"])
def test_sotu_corpus_refuses_a_split_that_leaves_a_side_empty(tmp_path, every):
    r = run_cli("sotu-corpus", "--out", tmp_path / "corpus", "--valid-every", every)
    assert r.returncode == 2 and "--valid-every must be an integer from 2 to" in r.stderr, r.stderr
    assert not (tmp_path / "corpus").exists()


def test_perplexity_refuses_a_batch_size_or_sentence_count_below_one(tmp_path):
    vocab = Vocab(["<S>", "</S>", "<UNK>", "the"])
    lm = LanguageModel(ElmoConfig.from_dict(TINY_LM_OPTIONS), len(vocab)).initialise(0)
    text = write_corpus(tmp_path / "valid.txt", sotu_sentences(limit=5))
    with pytest.raises(SettingError, match="batch_size must be a positive integer"):
        perplexity(lm, text, vocab, batch_size=0)
    with pytest.raises(SettingError, match="max_sentences must be a positive integer"):
        perplexity(lm, text, vocab, max_sentences=-1)
    assert torch.isfinite(torch.tensor(perplexity(lm, text, vocab, batch_size=2)["mean"]))


@pytest.mark.parametrize("name, value", [("tensorboard", "false"), ("compile", "no"), ("extend_vocab", 1)])
def test_train_options_refuse_a_flag_that_is_not_true_or_false(tmp_path, name, value):
    """A library caller's "false" would read as true: refused, naming the field (``bounds.check_flags``)."""
    with pytest.raises(SettingError) as e:
        TrainOptions(train="corpus.txt", out=str(tmp_path / "run"), **{name: value})
    assert e.value.text == f"`{name}` must be true or false, got {type(value).__name__} {value!r}"


def test_train_options_keep_numpy_bools_as_python_bools(tmp_path):
    opts = TrainOptions(train="corpus.txt", out=str(tmp_path / "run"), tensorboard=np.bool_(False))
    assert opts.tensorboard is False
