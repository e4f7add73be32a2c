"""``elmo demo``: sample corpus -> model -> ``elmo embed --pool mean`` (a vector a sentence) ->
summary -> what context does to a word -> the sentences nearest a query.

Then ``elmo probe`` on the held-out sotu speeches, for ``--word`` and three more words used both
as nouns and as verbs: per layer, how well a linear probe tells the uses apart (layer 0,
context-free, cannot); the nearest contexts of ``--word``; a picture of its contexts (with the
``plot`` extra; else the line says how to get it). Last, a query sentence (``--query``) and its 5
nearest sentences of the corpus by their pooled vectors.

Model: ``--model DIR`` (e.g. published weights) if given; else the repository's default model
(``models/default``) where the checkout has it; else the default model trained for
``--max-minutes`` (``training.default_model.train_default_model``, as ``elmo engine`` does).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from elmo_cli.vocabulary import Subcommands, add_flag, check_torch_model
from elmo_core.bounds import check_count
from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens
from training.options import check_max_minutes
from probing.probe import DEFAULT_WORDS, cosine_decimals

from .cmd_probe import report, texts

if TYPE_CHECKING:  # the model code loads when the demo runs, not when its parser is built
    from inference import Embedder
    from inference.model_run import ModelRun
    from probing.sentence_search import SentenceVectors

DEMO_WORDS = 4  # words probed by the demo (elmo probe: all of DEFAULT_WORDS)
NEAREST = 5  # sentences shown for the query


def get_model(work: Path, model: str | None, train_minutes: float) -> tuple[Path, str]:
    """(model directory, how it was obtained): the one given, else the shipped default model, else the
    default model trained here."""
    from training.default_model import shipped_model, train_default_model

    if model:
        return Path(model), f"given ({model})"
    if shipped := shipped_model():
        return shipped, "the shipped default model (its card.json says how it was trained)"
    trained = train_default_model(work / "default-model", train_minutes, log=lambda s: print(f"        {s}", flush=True))
    return trained, f"the default model, trained for {train_minutes:g} min on the sotu speeches"


def register(sub: Subcommands) -> None:
    p = sub.add_parser("demo", help="sample corpus -> elmo embed -> what context does to a word (elmo probe)")
    add_flag(p, "work_dir", default="runs/demo", help="corpus, trained model and vectors (default runs/demo)")
    add_flag(p, "model", help="model directory (default: the repository's models/default, else the default model "
                              "trained for --max-minutes)")
    add_flag(p, "weights")
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int)
    p.add_argument("--rows", type=int, default=2000, help="sentences of the sample corpus (default 2000)")
    p.add_argument("--word", default=DEFAULT_WORDS[0], help="a word used both as a noun and as a verb "
                                                           f"(default {DEFAULT_WORDS[0]})")
    add_flag(p, "max_minutes", type=float, default=3.0, help="the default model's training time, when there is no "
                                                             "--model and no models/default (default 3)")
    p.add_argument("--query", help="a sentence whose nearest corpus sentences the demo shows (default: the "
                                   "corpus's first of 8 tokens or more with --word)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.query is not None and not split_tokens(args.query):  # asked before the demo, not after it
        raise InputError("--query: give a sentence with at least one token (or leave --query out)")
    from corpora.sample import write_sample_corpus
    from inference import Embedder
    from probing.sentence_search import read_pooled

    check_count("rows", args.rows)
    check_max_minutes(args.max_minutes)  # also where a model is given: a bad time is a mistake either way
    check_torch_model(args.model, "demo")
    work = Path(args.work_dir)
    corpus = work / f"corpus-{args.rows}"  # one per --rows: a corpus kept from another run is not this one
    if not corpus.is_dir():
        write_sample_corpus(corpus, rows=args.rows, files=2)
    print(f"corpus  {corpus}: {args.rows} State of the Union sentences (sotu package)", flush=True)
    model, how = get_model(work, args.model, args.max_minutes)
    print(f"model   {model}: {how}", flush=True)
    run, vectors = embed_corpus(corpus, model, work, args)
    words = [args.word] + [w for w in DEFAULT_WORDS if w != args.word][:DEMO_WORDS - 1]
    with Embedder(run.open()) as embedder:
        report(embedder, words, texts(None), cap=100, neighbours=3, png=work / f"probe-{args.word}.png")
        search(embedder, read_pooled(vectors), args.query, args.word, vectors)
    return 0


def embed_corpus(corpus: Path, model: Path, work: Path, args: argparse.Namespace) -> tuple[ModelRun, Path]:
    """(the run, the vectors' folder): ``corpus`` embedded (``elmo embed --pool mean``) into a folder of
    its own per corpus and model, by the run the job makes once it scanned the corpus (its tokens
    weigh the run's layout, as ``elmo embed``'s), which the probe then opens too."""
    from inference.model_run import resolve_run
    from inference.registry import model_identity
    from inference.run_settings import RunSettings
    from pipelines.claim_first import RunMaker
    from pipelines.job import embed_parquet, summary_line

    settings = RunSettings("torch", args.device, args.threads, weights=args.weights)
    made: list[ModelRun] = []

    def make(flags: frozenset[str] | None, tokens: int | None) -> ModelRun:
        made.append(resolve_run(model, settings, job=True, flags=flags, expected_tokens=tokens))
        return made[-1]

    vectors = work / f"sentences-{args.rows}-{model_identity(model, 'torch', args.weights)['sha256'][:12]}"
    print(f"embed   {corpus} -> {vectors}: one mean-pooled vector a sentence (elmo embed --pool mean)", flush=True)
    manifest = embed_parquet(corpus, vectors, model=RunMaker(str(model), settings, make), keep_columns=["text"],
                             id_column="id", pool="mean", resume=(vectors / "_job.parquet").is_file(), quiet=True)
    print(summary_line(manifest, vectors))
    return made[-1], vectors


def search(embedder: Embedder, corpus: SentenceVectors, query: str | None, word: str, where: Path) -> None:
    """The query (default: the corpus's first sentence of 8 tokens or more with ``word``) and its
    NEAREST sentences of the corpus by their pooled vectors."""
    from probing.sentence_search import nearest_sentences

    if query is None:
        with_word = [t for t in corpus.texts if word in split_tokens(t) and len(split_tokens(t)) >= 8]
        query = (with_word or corpus.texts)[0]
    tokens = split_tokens(query)
    if not tokens:
        raise InputError("--query: give a sentence with at least one token")
    vector = embedder.embed_sentences([tokens], output="mixed", pool="mean")[0]  # (D,), as elmo embed pools
    found = nearest_sentences(corpus, vector, NEAREST, query)
    d = cosine_decimals([cos for _, cos in found])
    print(f"search  the {len(found)} sentences of {where} nearest by mean-pooled vectors (cosine) to: {query}")
    for text, cos in found:
        print(f"        {cos:.{d}f}  {text}")
