"""``elmo embed --text INPUT --out OUTPUT_DIR --model MODEL`` (Parquet text in, Parquet ELMo vectors out),
``elmo verify --out OUTPUT_DIR`` (check a finished output) and ``elmo sample-corpus --out DIR`` (a Parquet
corpus of State of the Union sentences)."""
from __future__ import annotations

import argparse
import json

from elmo_cli.run_args import add_precision_argument, checked, exporter
from elmo_cli.vocabulary import Subcommands, add_fields, add_flag, field_values
from elmo_core.names import OUTPUT_FORMATS
from elmo_core.errors import InputError
from elmo_core.vectors import VectorRequest
from inference.run_settings import RunSettings
from pipelines.options import EmbedOptions


def register(sub: Subcommands) -> None:
    """embed's options are generated from ``EmbedOptions``' fields (``elmo_cli.vocabulary``)."""
    _register_sample_corpus(sub)
    _register_verify(sub)
    p = sub.add_parser("embed", help="embed a corpus (Parquet, CSV, TSV, JSON Lines, text) into Parquet ELMo vectors",
                       description="Stream the rows of INPUT (Parquet, CSV, TSV, JSON Lines or text) through a biLM; "
                                   "write a shard per input file chunk (Parquet, Arrow) or one hdf5 file into "
                                   "OUTPUT_DIR, exactly once (see docs/pipelines.md).")
    add_flag(p, "text", required=True, metavar="INPUT",
             help="a file (.parquet, .csv, .tsv, .jsonl/.ndjson, or .txt: one sentence per line), a directory of "
                  "them, or a glob, or a file or prefix on an object store (s3://bucket/corpus); the format is told "
                  "by the suffix")
    add_flag(p, "out", required=True, metavar="OUTPUT_DIR",
             help="output directory (new or empty; or this job's, with --resume), local or s3://bucket/prefix; with "
                  "--format hdf5 the (local) file to write")
    p.add_argument("--format", choices=OUTPUT_FORMATS, default=OUTPUT_FORMATS[0],
                   help="parquet: shards of Parquet; arrow: shards of Arrow IPC (Feather v2, memory-mappable, the "
                        "fastest to write); hdf5: the file `allennlp elmo` writes (one dataset per sentence, "
                        "sentence_to_index)")
    p.add_argument("--use-sentence-keys", action="store_true",
                   help="--format hdf5: key each dataset by its sentence instead of its index")
    add_flag(p, "model", required=True, help="model directory (options.json + weights), or an export dir; local or "
                                             "on a store (s3://bucket/models/elmo)")
    groups = add_fields(p, EmbedOptions)
    add_fields(p, VectorRequest, groups=groups)
    add_fields(p, RunSettings, groups=groups)
    add_precision_argument(groups["vectors"])
    add_flag(groups["running"], "json", help="print the manifest as JSON on stdout")
    p.set_defaults(func=run_embed)


def run_embed(args: argparse.Namespace) -> int:
    if args.use_sentence_keys and args.format != "hdf5":
        raise InputError("--use-sentence-keys keys the datasets of --format hdf5; add --format hdf5")
    if args.format != "hdf5" and args.out.endswith((".hdf5", ".h5")):
        raise InputError(f"{args.text} -> {args.out}: an .hdf5 output is --format hdf5 "
                         f"(allennlp elmo's layout); add --format hdf5")
    shards = {"format": args.format} if args.format != "hdf5" else {}
    opts = EmbedOptions.coerce(field_values(EmbedOptions, args), **field_values(VectorRequest, args),
                               **shards)  # errors before an export
    settings = RunSettings(**field_values(RunSettings, args), precision=args.precision, layout=args.layout)
    from pipelines.claim_first import RunMaker

    def resolve(flags, tokens):  # backend, precision (auto; on-demand export), threads, layout: once OUTPUT_DIR
        from inference.model_run import resolve_run  # and the inputs are checked; the model code loads then

        return checked(args, resolve_run(args.model, settings, job=True, remote=opts.engine != "local",
                                         exporter=exporter(args), flags=flags, expected_tokens=tokens))

    maker = RunMaker(args.model, settings, resolve)  # an existing OUTPUT_DIR is judged before the model loads
    if args.format == "hdf5":
        from pipelines.hdf5_output import write_hdf5

        result = write_hdf5(args.text, args.out, maker, opts, use_sentence_keys=args.use_sentence_keys)
        if args.json:
            print(json.dumps(result, indent=2))
        return 0
    from pipelines.job import run_job

    manifest = run_job(args.text, args.out, maker, opts)
    if args.json:
        print(json.dumps(manifest, indent=2))
    return 0


def _register_sample_corpus(sub: Subcommands) -> None:
    p = sub.add_parser("sample-corpus", help="write a sample Parquet corpus of State of the Union sentences")
    add_flag(p, "out", required=True, metavar="DIR", help="the directory to write the Parquet files into")
    p.add_argument("--rows", type=int, default=2000, help="sentences in all (default 2000)")
    p.add_argument("--files", type=int, default=2, help="Parquet files they are split into (default 2)")
    add_flag(p, "json")
    p.set_defaults(func=run_sample_corpus)


def run_sample_corpus(args: argparse.Namespace) -> int:
    from corpora.sample import write_sample_corpus

    paths = write_sample_corpus(args.out, args.rows, args.files)
    if args.json:
        print(json.dumps({"out_dir": str(args.out), "rows": args.rows, "files": [str(p) for p in paths]}))
        return 0
    print(f"wrote {args.rows} sentences into {len(paths)} files under {args.out} (columns id, speech, text)")
    return 0


def _register_verify(sub: Subcommands) -> None:
    p = sub.add_parser("verify", help="check a finished elmo embed OUTPUT_DIR (rows, order, checksums) "
                                      "without recomputing vectors")
    add_flag(p, "out", required=True, metavar="OUTPUT_DIR", help="the elmo embed job's OUTPUT_DIR, local or "
                                                                 "s3://bucket/prefix")
    p.add_argument("--no-inputs", action="store_true", help="do not match output rows to the input files")
    add_flag(p, "json", help="print the report as JSON on stdout")
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from pipelines.verify import VerificationError, verify_output

    try:
        report = verify_output(args.out, check_inputs=not args.no_inputs)
    except VerificationError as e:
        if args.json:  # a script reads the verdict on stdout either way (the message still goes to stderr)
            print(json.dumps({"ok": False, "problems": e.problems}, indent=2))
        raise
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    not_checked = f"; inputs not checked (changed or absent): {report['inputs_not_checked']}" \
        if report["inputs_not_checked"] else ""
    print(f"{args.out}: OK: {report['shards']} shards, {report['rows']:,} rows, {report['tokens']:,} tokens; "
          f"checksums match; rows in input order against {report['inputs_checked']} input file(s){not_checked}")
    return 0
