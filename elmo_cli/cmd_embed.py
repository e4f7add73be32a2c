"""``elmo embed INPUT OUTPUT_DIR --model MODEL`` (Parquet text in, Parquet ELMo vectors out),
``elmo verify OUTPUT_DIR`` (check a finished output) and ``elmo sample-corpus OUT_DIR`` (a Parquet
corpus of State of the Union sentences)."""
from __future__ import annotations

import argparse
import json

from elmo_cli.cmd_tokens import add_token_embedding_arguments
from elmo_cli.precision_args import add_precision_argument, settle_precision
from elmo_core.names import DTYPES, ENGINES, OUTPUT_FORMATS, OUTPUT_NAMES, POOLS
from inference.registry import BACKEND_NAMES, exported_backend
from corpora.sample import write_sample_corpus
from elmo_core.errors import InputError
from pipelines.hdf5_output import embed_to_hdf5, is_text_input
from pipelines.job import embed_parquet
from pipelines.options import EmbedOptions
from pipelines.schema import COMPRESSIONS
from pipelines.verify import verify_output



def register(sub: argparse._SubParsersAction) -> None:
    _register_sample_corpus(sub)
    _register_verify(sub)
    d = EmbedOptions()
    p = sub.add_parser("embed", help="embed a Parquet corpus into Parquet ELMo vectors (local or Ray)",
                       description="Stream Parquet rows through a biLM; write one Parquet shard per input "
                                   "file chunk into OUTPUT_DIR (see docs/pipelines.md).")
    p.add_argument("input", help="a Parquet file, a directory of them, or a glob, or a file or prefix on an object "
                                 "store (s3://bucket/corpus); with --format hdf5 also a text file of one "
                                 "whitespace-tokenized sentence per line")
    p.add_argument("output_dir", help="output directory (new or empty; or this job's, with --resume), local or "
                                      "s3://bucket/prefix; with --format hdf5 the (local) file to write")
    p.add_argument("--format", choices=OUTPUT_FORMATS, default=OUTPUT_FORMATS[0],
                   help="hdf5: the file `allennlp elmo` writes (one dataset per sentence, sentence_to_index)")
    p.add_argument("--use-sentence-keys", action="store_true",
                   help="--format hdf5: key each dataset by its sentence instead of its index")
    p.add_argument("--model", required=True, help="model directory (options.json + weights), or an export dir; "
                                                 "local or on a store (s3://bucket/models/elmo)")
    p.add_argument("--weights", help="the weights file, when --model's directory holds several (or --model is "
                                     "an options.json)")
    p.add_argument("--backend", choices=BACKEND_NAMES, help=f"default: the export's own for an export directory "
                                                              f"(its manifest.json), else {d.backend}")
    cols = p.add_argument_group("columns")
    cols.add_argument("--text-column", default=d.text_column, help="whitespace-tokenized text (default: text)")
    cols.add_argument("--tokens-column", help="list<string> tokens (instead of --text-column)")
    cols.add_argument("--id-column", help="copied to the output first")
    cols.add_argument("--keep-columns", default="", help="comma-separated columns copied to the output")
    out = p.add_argument_group("vectors")
    out.add_argument("--output", default=d.output, help=f"what becomes of the layers: {OUTPUT_NAMES} "
                                                         f"(default {d.output})")
    out.add_argument("--pool", choices=POOLS, help="one vector per row, pooled over its tokens (null for an empty row)")
    out.add_argument("--mix", help="scalar mix weights s0,s1,... (before softmax; default equal)")
    out.add_argument("--gamma", type=float, default=d.gamma)
    out.add_argument("--normalize", action="store_true",
                     help="scale each vector (per token and layer, or pooled with --pool) to unit L2 norm")
    out.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    add_precision_argument(out)
    out.add_argument("--compression", choices=COMPRESSIONS, default=d.compression,
                     help="of the output shards (measured: all about as fast; zstd 8%% smaller in float16)")
    out.add_argument("--max-sentence-length", type=int, default=d.max_sentence_length,
                     help="longer rows are embedded in overlapping windows and joined back")
    out.add_argument("--window-context", type=int, help="context tokens each side of a window (default M/8)")
    _add_running_arguments(p.add_argument_group("running"), d)
    p.set_defaults(func=run_embed)


def _add_running_arguments(run: argparse._ArgumentGroup, d: EmbedOptions) -> None:
    """The options that change how fast a job runs and how it resumes, not what it writes."""
    run.add_argument("--max-tokens-per-batch", type=int, default=d.max_tokens_per_batch,
                     help="padded tokens (rows x longest row) per model call")
    run.add_argument("--sort-window-rows", type=int, default=d.sort_window_rows,
                     help="rows sorted by length together before batching")
    run.add_argument("--sort-window-tokens", type=int, default=d.sort_window_tokens,
                     help="at most this many tokens in one sort window (bounds memory; local engine)")
    run.add_argument("--rows-per-shard", type=int, default=d.rows_per_shard)
    run.add_argument("--threads", type=int, help="the model's threads (default: every core for a model whose "
                                                  "compute dominates the job, all but one for a small model; "
                                                  "see docs/pipelines.md)")
    add_token_embedding_arguments(run)
    run.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N: where the torch / onnx backend runs")
    run.add_argument("--engine", choices=ENGINES, default=d.engine)
    run.add_argument("--workers", type=int, default=d.workers, help="Ray workers (model replicas)")
    run.add_argument("--writer-threads", type=int, default=d.writer_threads,
                     help="shards encoded to Parquet at once (per worker); see docs/pipelines.md")
    run.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")
    run.add_argument("--num-gpus-per-worker", type=float, default=d.num_gpus_per_worker)
    run.add_argument("--spark-master", help="--engine spark: local[N], spark://HOST:PORT, yarn, k8s://... "
                                            "(default local[*])")
    run.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                     help="--engine spark: a Spark setting, e.g. spark.executor.memory=8g (repeatable)")
    run.add_argument("--resume", action="store_true", help="keep verified shards, redo the rest")
    run.add_argument("--verify-inputs", action="store_true",
                     help="hash every input file's bytes into the job (an edit that keeps size and mtime is seen)")
    run.add_argument("--quiet", action="store_true", help="no progress bar and summary")
    run.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")


def options_from_args(args: argparse.Namespace) -> dict:
    names = ("backend", "text_column", "tokens_column", "id_column", "keep_columns", "output", "pool", "mix", "gamma",
             "dtype", "max_sentence_length", "window_context", "max_tokens_per_batch", "sort_window_rows",
             "sort_window_tokens", "rows_per_shard", "threads", "engine", "workers", "writer_threads",
             "ray_address", "num_gpus_per_worker", "spark_master", "spark_conf", "resume", "quiet", "device", "weights",
             "verify_inputs", "compression",
             "token_embeddings", "token_vocab", "precision", "normalize")
    reason = settle_precision(args)  # auto becomes the precision it picks
    return {n: getattr(args, n) for n in names} | {"precision_reason": reason}


def run_embed(args: argparse.Namespace) -> int:
    if args.use_sentence_keys and args.format != "hdf5":
        raise InputError("--use-sentence-keys keys the datasets of --format hdf5; add --format hdf5")
    if args.format != "hdf5" and (args.output_dir.endswith((".hdf5", ".h5")) or is_text_input(args.input)):
        raise InputError(f"{args.input} -> {args.output_dir}: a text INPUT or an .hdf5 output is --format hdf5 "
                         f"(allennlp elmo's layout); add --format hdf5")
    args.backend = args.backend or exported_backend(args.model) or EmbedOptions().backend
    options = options_from_args(args)  # settles the precision: --model may become its on-demand export
    if args.format == "hdf5":
        result = embed_to_hdf5(args.input, args.output_dir, args.model, use_sentence_keys=args.use_sentence_keys,
                               **options)
        if args.json:
            print(json.dumps(result, indent=2))
        return 0
    manifest = embed_parquet(args.input, args.output_dir, args.model, **options)
    if args.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _register_sample_corpus(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sample-corpus", help="write a sample Parquet corpus of State of the Union sentences")
    p.add_argument("out_dir")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--files", type=int, default=2)
    p.set_defaults(func=run_sample_corpus)


def run_sample_corpus(args: argparse.Namespace) -> int:
    paths = write_sample_corpus(args.out_dir, args.rows, args.files)
    print(f"wrote {args.rows} sentences into {len(paths)} files under {args.out_dir} (columns id, speech, text)")
    return 0


def _register_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check a finished elmo embed OUTPUT_DIR (rows, order, checksums) "
                                      "without recomputing vectors")
    p.add_argument("output_dir", help="the job's OUTPUT_DIR, local or s3://bucket/prefix")
    p.add_argument("--no-inputs", action="store_true", help="do not match output rows to the input files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    report = verify_output(args.output_dir, check_inputs=not args.no_inputs)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    not_checked = f"; inputs not checked (changed or absent): {report['inputs_not_checked']}" \
        if report["inputs_not_checked"] else ""
    print(f"{args.output_dir}: OK: {report['shards']} shards, {report['rows']:,} rows, {report['tokens']:,} tokens; "
          f"checksums match; rows in input order against {report['inputs_checked']} input file(s){not_checked}")
    return 0
