"""``elmo dump-tokens``: a token-embedding file (the char-CNN representation of each vocabulary
word, bilm-tf's ``dump_token_embeddings`` layout), which ``--token-embeddings`` in ``elmo embed``
and ``elmo serve`` reads."""
from __future__ import annotations

import argparse
import json
import time

from elmo_cli.vocabulary import Subcommands, add_flag


def register(sub: Subcommands) -> None:
    p = sub.add_parser("dump-tokens", help="write each vocabulary word's char-CNN vector (token_embeddings.hdf5)",
                       description="Write the dataset 'embedding' (V, P), row k for line k of VOCAB, as bilm-tf's "
                                   "dump_token_embeddings does, plus 'tokens' (the words). --token-embeddings FILE "
                                   "in elmo embed / elmo serve then skips the char-CNN for those words.")
    add_flag(p, "model", required=True, help="model directory (options.json + weights), or options.json")
    add_flag(p, "weights")
    p.add_argument("--vocab", required=True, help="vocabulary file, one token per line (<S>, </S> included)")
    add_flag(p, "out", required=True, help="the hdf5 file to write (atomically)")
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int)
    add_flag(p, "json")
    p.set_defaults(func=run_dump_tokens)


def run_dump_tokens(args: argparse.Namespace) -> int:
    from formats import load_bilm, resolve_model
    from formats.token_embeddings import TokenEmbeddings, read_vocab_lines, write_token_embeddings
    from inference.registry import check_device
    from inference.run_settings import check_device_name
    from inference.token_cache import compute_token_embeddings

    from runtime import use_threads

    start = time.perf_counter()
    check_device_name(args.device)
    check_device(args.device)  # a GPU this process cannot reach: named before the model loads
    use_threads(args.threads)
    tokens = read_vocab_lines(args.vocab)
    files = resolve_model(args.model, args.weights)
    model = load_bilm(files.options, files.weights).eval().to(args.device)
    vectors = compute_token_embeddings(model, tokens)  # (V, P)
    write_token_embeddings(args.out, TokenEmbeddings(tokens, vectors))
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({"out": str(args.out), "tokens": len(tokens), "dim": int(vectors.shape[1]), "seconds": seconds}))
        return 0
    print(f"wrote {args.out}: {len(tokens):,} tokens x {vectors.shape[1]} in {time.perf_counter() - start:.1f} s")
    return 0
