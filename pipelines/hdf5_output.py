"""``elmo embed INPUT OUT.hdf5 --format hdf5``: the file ``allennlp elmo`` (AllenNLP <= 0.9) writes.

Its conventions, each kept (allennlp/commands/elmo.py, 0.9.0):
- a text INPUT holds one whitespace-tokenized sentence per line; the sentence is the stripped line
  (inner spaces kept) and its tokens ``split_tokens(line)`` (``elmo_core.whitespace``); an empty line is an error;
- one float32 dataset per sentence, keyed by its line index as a string ('0', '1', ...), or by
  the sentence itself with ``use_sentence_keys`` (a repeated sentence is then an error);
- shape (L+1, T, D) for output 'all', (T, D) for the others; 'average' is the plain mean of the
  layers; the boundary tokens are not included;
- without ``use_sentence_keys``, the dataset ``sentence_to_index``, shape (1,), one variable-length
  string holding ``json.dumps({sentence: index string})`` (a repeated sentence maps to its last
  index).
A Parquet INPUT gives its rows in order (files in name order), the text column's (or the tokens
column's joined) text as the sentence; a null or empty row gives a (.., 0, D) dataset, as
allennlp's ``embed_batch`` does for an empty sentence. One difference: our biLM is stateless, so
a sentence's vectors do not depend on the sentences before it (allennlp carries each batch row's
LSTM state into the next batch of 64 lines; its first batch is what we compute).
Streamed: ``sort_window_rows`` sentences at a time; written to a temporary file renamed over OUT
at the end, so OUT is either the whole result or untouched.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import pyarrow.dataset as ds

from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens
from inference import Embedder
from inference.registry import model_config

from .options import EmbedOptions
from .predictor import default_threads
from .rows import row_tokens
from .source import PARQUET_SUFFIXES, resolve_inputs, scan_inputs

SENTENCE_TO_INDEX = "sentence_to_index"
# Options of the Parquet output that the hdf5 layout has no place for.
PARQUET_ONLY = {"pool": None, "id_column": None, "keep_columns": (), "engine": "local", "resume": False}


def is_text_input(spec: str | Path) -> bool:
    path = Path(spec)
    return path.is_file() and path.suffix.lower() not in PARQUET_SUFFIXES


def text_sentences(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(sentence, tokens) per line of a text file."""
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            for n, line in enumerate(f):
                sentence = line.strip()
                if not sentence:
                    raise InputError(f"{path}: line {n + 1} is empty; `allennlp elmo` files hold one sentence per "
                                     f"line (dataset keys are line indexes): remove empty lines")
                yield sentence, split_tokens(sentence)
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text ({e}); a text INPUT holds one UTF-8 sentence per line") from None


def parquet_sentences(spec: str | Path, opts: EmbedOptions) -> Iterator[tuple[str, list[str]]]:
    """(sentence, tokens) per row of the Parquet inputs, files in order."""
    column = opts.tokens_column or opts.text_column
    for file in scan_inputs(spec, opts):
        for batch in ds.dataset(str(file.path), format="parquet").to_batches(columns=[column],
                                                                              batch_size=opts.sort_window_rows):
            texts = batch.column(0).to_pylist() if not opts.tokens_column else None
            rows, _ = row_tokens(batch.column(0), opts.tokens_column is not None, column)
            for i, tokens in enumerate(rows):
                text = (texts[i] or "").strip() if texts is not None else " ".join(tokens or [])
                yield text, tokens or []


def _check_options(opts: EmbedOptions, out: Path) -> None:
    given = [k for k, default in PARQUET_ONLY.items() if getattr(opts, k) != default]
    if given:
        raise InputError(f"--format hdf5 writes allennlp elmo's layout, which has no place for "
                         f"{', '.join('--' + k.replace('_', '-') for k in given)}; leave them out or use --format parquet")
    if out.is_dir():
        raise InputError(f"{out}: is a directory; --format hdf5 writes one file (e.g. OUT.hdf5)")


def embed_to_hdf5(input: str | Path, out: str | Path, /, model: str | Path, use_sentence_keys: bool = False,
                  **options: Any) -> dict:
    """Write ``out`` in allennlp elmo's layout (see the module doc); return counts and timing.

    Shape: sentence i -> dataset str(i): (L+1, T_i, D) for output 'all', else (T_i, D).
    """
    opts = EmbedOptions.coerce(options)
    out = Path(out)
    _check_options(opts, out)
    sentences = text_sentences(Path(input)) if is_text_input(input) else parquet_sentences(input, opts)
    if not is_text_input(input):
        resolve_inputs(input)  # a missing INPUT is named before the model loads
    threads = opts.threads or default_threads(model_config(model, opts.backend, opts.weights), opts.device)
    weights = {"weights": opts.weights} if opts.weights else {}
    start = time.perf_counter()
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with Embedder.open(model, opts.backend, threads=threads, device=opts.device, **weights,
                           **opts.backend_options) as embedder, h5py.File(tmp, "w") as f:
            counts = _write(f, embedder, sentences, opts, use_sentence_keys)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    result = {**counts, "output": str(out), "seconds": round(time.perf_counter() - start, 3)}
    if not opts.quiet:
        print(f"wrote {out}: {counts['sentences']:,} sentences, {counts['tokens']:,} tokens in "
              f"{result['seconds']:.1f} s", file=sys.stderr)
    return result


def _write(f: h5py.File, embedder: Embedder, sentences: Iterator[tuple[str, list[str]]], opts: EmbedOptions,
           use_sentence_keys: bool) -> dict:
    index: dict[str, str] = {}
    n = tokens = 0
    dtype = np.float16 if opts.dtype == "float16" else np.float32
    for chunk in _chunks(sentences, opts.sort_window_rows):
        vectors = embedder.embed_sentences([t for _, t in chunk], output=opts.output, mix_weights=opts.mix,
                                           gamma=opts.gamma)
        for (sentence, toks), v in zip(chunk, vectors):
            key = sentence if use_sentence_keys else str(n)
            if use_sentence_keys:
                _check_key(key, n, index.get(sentence))
            f.create_dataset(key, data=v.astype(dtype, copy=False))
            index[sentence] = str(n)
            n, tokens = n + 1, tokens + len(toks)
    if not use_sentence_keys:
        f.create_dataset(SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(), data=[json.dumps(index)])
    return {"sentences": n, "tokens": tokens}


def _check_key(key: str, n: int, earlier: str | None) -> None:
    """A sentence as a dataset name (--use-sentence-keys)."""
    if earlier is not None:
        raise InputError(f"sentence {n} repeats sentence {earlier} ({key[:60]!r}); with --use-sentence-keys every "
                         f"sentence must be unique (leave the flag out to key by index)")
    if "/" in key or key in (".", SENTENCE_TO_INDEX):
        raise InputError(f"sentence {n} ({key[:60]!r}) cannot be an hdf5 dataset name ('/' separates groups); "
                         f"leave out --use-sentence-keys to key by index")


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
