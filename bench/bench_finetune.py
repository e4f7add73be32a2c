"""Does fine-tuning pay? (`elmo train --init-from`, issue 17)

The sotu speeches before 1900 are the general corpus; those after 1950 the domain, split by speech
(every 5th speech held out). A model is pretrained on the general corpus for --pretrain-minutes;
then, on the domain's train split, (b) it is fine-tuned for --minutes and (c) the same architecture
is trained from scratch for the same --minutes. All three are scored on the domain's held-out
speeches with the pretrained model's vocabulary (so the perplexities compare: domain words it lacks
are <UNK> for all three), full softmax, forward / backward / mean:
  (a) pretrained, unchanged   (b) fine-tuned   (c) from scratch on the domain
Same optimizer settings for every run (--optimizer, --lr; constant, no warm-up), --options small.json.

    python bench/bench_finetune.py [--pretrain-minutes 15] [--minutes 10] [--valid-sentences 2000]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpora.sotu import sotu_fileids, sotu_speech, split_sentences  # noqa: E402
import torch  # noqa: E402
from training.perplexity import load_language_model, perplexity  # noqa: E402
from training.trainer import TrainOptions, train  # noqa: E402
from training.vocab import Vocab  # noqa: E402


def write_split(work: Path) -> dict[str, int]:
    """WORK/general (speeches < 1900), WORK/domain/train and WORK/domain/valid (speeches >= 1950)."""
    counts = {}
    ids = sotu_fileids()
    domain = [s for s in ids if int(s[:4]) >= 1950]
    splits = {"general": [s for s in ids if int(s[:4]) < 1900],
              "domain/valid": domain[2::5], "domain/train": [s for i, s in enumerate(domain) if i % 5 != 2]}
    for name, speeches in splits.items():
        d = work / name
        d.mkdir(parents=True, exist_ok=True)
        tokens = 0
        for sid in speeches:
            sents = split_sentences(sotu_speech(sid))
            (d / f"{sid}.txt").write_text("".join(" ".join(s) + "\n" for s in sents), encoding="utf-8")
            tokens += sum(map(len, sents))
        counts[name] = tokens
    return counts


def score(model_dir: Path, valid: Path, vocab_from: Path, sentences: int) -> dict:
    lm, _ = load_language_model(model_dir)
    return perplexity(lm, valid, Vocab.load(vocab_from / "vocab.txt"), 32, sentences)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pretrain-minutes", type=float, default=15.0)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--options", default=str(ROOT / "training" / "configs" / "small.json"))
    ap.add_argument("--valid-sentences", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "elmo-bench-finetune"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.workdir)
    print("tokens:", json.dumps(write_split(work)), flush=True)
    # the settings the README's figure was measured with: constant lr, no warm-up, small.json
    common = dict(optimizer=args.optimizer, lr=args.lr, warmup_steps=0, lr_decay="none", threads=args.threads,
                  checkpoint_every=0, log_every=200, min_count=3)
    log = lambda s: print("  " + s, flush=True)  # noqa: E731
    runs = {"pretrained": work / "pretrain", "fine-tuned": work / "finetune", "scratch": work / "scratch"}
    t0 = time.perf_counter()
    if not (runs["pretrained"] / "model" / "softmax.hdf5").is_file():
        print(f"pretraining on the speeches before 1900 for {args.pretrain_minutes:g} min", flush=True)
        train(TrainOptions(train=str(work / "general"), options=args.options, out=str(runs["pretrained"]),
                           max_minutes=args.pretrain_minutes, **common), log=log)
    vocab = runs["pretrained"] / "model" / "vocab.txt"
    for name, extra in (("fine-tuned", dict(options=None, init_from=str(runs["pretrained"] / "model"))),
                        ("scratch", dict(options=args.options, vocab=str(vocab)))):
        print(f"{name}: {args.minutes:g} min on the speeches after 1950", flush=True)
        train(TrainOptions(train=str(work / "domain/train"), out=str(runs[name]), max_minutes=args.minutes,
                           **extra, **common), log=log)
    print(f"\nheld-out perplexity on the speeches after 1950 ({args.valid_sentences} sentences, the pretrained "
          f"model's vocabulary), {time.perf_counter() - t0:.0f} s in all")
    print(f"{'model':<12}{'forward':>10}{'backward':>10}{'mean':>10}")
    results = {}
    for name, run in runs.items():
        r = results[name] = score(run / "model", work / "domain/valid", runs["pretrained"] / "model", args.valid_sentences)
        print(f"{name:<12}{r['forward']:>10.1f}{r['backward']:>10.1f}{r['mean']:>10.1f}", flush=True)
    best_other = min(results["pretrained"]["mean"], results["scratch"]["mean"])
    print(f"fine-tuned vs the better of the other two (mean): {results['fine-tuned']['mean']:.1f} vs {best_other:.1f} "
          f"= {best_other / results['fine-tuned']['mean']:.2f}x lower perplexity")


if __name__ == "__main__":
    main()
