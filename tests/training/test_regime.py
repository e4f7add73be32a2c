"""The default training regime as a user meets it: trained for stateless use, curves in
TensorBoard, the final evaluation inside --max-minutes, exact resume after a SIGKILL."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import checkpoint as ck
from training.perplexity import load_language_model, perplexity
from training.trainer import train

from tests.helpers import killed_inside
from tests.processes import wait_until
from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus, write_options

ROOT = Path(__file__).resolve().parents[2]


def short_lines(n: int) -> list[list[str]]:
    """Sentences cut after , ; : into pieces of 3-10 tokens (the short-lines corpus, small)."""
    out = []
    for s in sotu_sentences(limit=None):
        piece = []
        for w in s:
            piece.append(w)
            if w in (",", ";", ":"):
                if 3 <= len(piece) <= 10:
                    out.append(piece)
                piece = []
    return out[:n]


def _log_ppl(run: Path) -> float:
    rec = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rec if "train_loss" in r][-1]
    return math.exp(last["train_loss"])


@pytest.mark.parametrize("batching", ["packed", "stateful"])
def test_stateless_perplexity_on_own_lines_near_the_training_log(tmp_path, batching):
    """Short lines, a full softmax (so the log's perplexity is the model's): with the default
    regime each line is trained from a zero state, so scoring the training lines stateless gives
    what the log said (dropout makes the log the higher one). The original's stateful regime is
    run too, to show what the check catches: there the model has never started from zero."""
    lines = short_lines(300)
    p = write_corpus(tmp_path / "short.txt", lines)
    opts = write_options(tmp_path / "o.json", n_negative_samples_batch=100000, dropout=0.0)
    run = tmp_path / batching
    train(tiny_run(tmp_path, p, out=batching, options=str(opts), max_steps=300, log_every=20, batching=batching,
                   optimizer="adam", lr=0.01, train_eval_sentences=0), log=lambda s: None)
    lm, vocab = load_language_model(run / "model")
    stateless = perplexity(lm, p, vocab)["mean"]
    logged = _log_ppl(run)
    ratio = stateless / logged
    if batching == "packed":
        assert ratio < 1.5, (stateless, logged)
    else:
        assert ratio > 1.5, (stateless, logged)  # the defect the default regime removes, on this data


def test_tensorboard_event_file_holds_the_runs_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    v = write_corpus(tmp_path / "valid.txt", sotu_sentences("1794-Washington-1", limit=10))
    train(tiny_run(tmp_path, p, max_steps=6, log_every=2, checkpoint_every=3, valid=str(v), train_eval_sentences=5),
          log=lambda s: None)
    run = tmp_path / "run"
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for direction in ("forward", "backward"):
        assert {f"train/loss_{direction}", f"train/ppl_{direction}", f"valid/ppl_{direction}"} <= tags
    assert {"train/lr", "train/tokens_per_s", "train/grad_norm", "valid/ppl_mean", "train_eval/ppl_mean"} <= tags
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r for r in records if "train_loss" in r}
    ppl = {e.step: e.value for e in events.Scalars("train/ppl_forward")}
    assert sorted(ppl) == sorted(logged) == [2, 4, 6]
    for step, value in ppl.items():
        assert value == pytest.approx(logged[step]["train_ppl_forward"], rel=1e-6)  # float32 in the event file
    assert all(e.value > 0 for e in events.Scalars("train/grad_norm"))
    valid = [r for r in records if "valid_ppl_mean" in r]
    assert [e.step for e in events.Scalars("valid/ppl_mean")] == [r["step"] for r in valid] == [3, 6]


def test_final_evaluation_is_inside_max_minutes(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    v = write_corpus(tmp_path / "valid.txt", sotu_sentences("1794-Washington-1"))
    lines: list[str] = []
    summary = train(tiny_run(tmp_path, p, max_minutes=0.25, valid=str(v), log_every=50), log=lines.append)
    plan = json.loads((tmp_path / "run" / "run.json").read_text())["final_eval"]
    assert plan["reserved_s"] > 0 and plan["sentences"] == summary["valid"]["sentences"]
    assert any(line.startswith("final evaluation:") and "training stops at" in line for line in lines)
    assert summary["train_s"] <= 15 - plan["reserved_s"] + 2.0  # training stopped early to leave room for it
    assert summary["train_eval"] is not None and summary["valid_over_train"] > 0


def _cli_train(tmp_path, corpus, out, max_steps):
    return [sys.executable, "-m", "elmo_cli", "train", "--text", str(corpus), "--out", str(tmp_path / out),
            "--options", str(write_options(tmp_path / "tiny.json")), "--min-count", "1", "--max-steps", str(max_steps),
            "--checkpoint-every", "3", "--keep-checkpoints", "50", "--threads", "1", "--shuffle-buffer", "50",
            "--seed", "7", "--lr-decay-tokens", "4000", "--no-tensorboard", "--train-eval-sentences", "0"]


def test_default_batching_resumes_exactly_after_sigkill(tmp_path, spawn):
    corpus = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=80))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(_cli_train(tmp_path, corpus, "straight", 24), cwd=ROOT, env=env, check=True, capture_output=True)
    proc = spawn(_cli_train(tmp_path, corpus, "killed", 24), cwd=ROOT, env=env,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "killed" / "checkpoints"
    wait_until(lambda: ck.latest_step(ckpts, 1) is not None, "a checkpoint written", proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ck.latest_step(ckpts, 1)
    assert killed_at is not None and killed_at < 24, killed_at  # killed mid-run, after a checkpoint
    left = killed_inside(spawn, "file", ck.main_path(ckpts, 24))  # as a SIGKILL inside a checkpoint's write leaves it
    resumed = subprocess.run(_cli_train(tmp_path, corpus, "killed", 24) + ["--resume"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {killed_at}" in resumed.stdout
    assert not left.exists() and not list(ckpts.glob(".*.tmp"))  # the resumed run's write of that step removed it
    a = ck.read(ck.main_path(tmp_path / "straight" / "checkpoints", 24))[0]
    b = ck.read(ck.main_path(ckpts, 24))[0]
    assert set(a) == set(b)
    for name in a:  # float32 over a few dozen updates: the same operations give the same bits
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name
