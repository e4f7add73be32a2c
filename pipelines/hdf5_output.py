"""``elmo embed --text INPUT --out OUT.hdf5 --format hdf5``: the file ``allennlp elmo`` (AllenNLP <= 0.9) writes.

Its conventions, each kept (allennlp/commands/elmo.py, 0.9.0):
- a text INPUT holds one whitespace-tokenized sentence per line; the sentence is the stripped line
  (inner spaces kept) and its tokens ``split_tokens(line)`` (``elmo_core.whitespace``); an empty line is an error;
- one dataset per sentence in the vectors' dtype (float32 by default, as allennlp), keyed by its
  line index as a string ('0', '1', ...), or by
  the sentence itself with ``use_sentence_keys`` (a repeated sentence is then an error);
- shape (L+1, T, D) for output 'all', (T, D) for the others; 'average' is the plain mean of the
  layers; the boundary tokens are not included;
- without ``use_sentence_keys``, the dataset ``sentence_to_index``, shape (1,), one variable-length
  string holding ``json.dumps({sentence: index string})`` (a repeated sentence maps to its last
  index).
A Parquet INPUT gives its rows in order (files in name order), the text column's (or the tokens
column's joined) text as the sentence; a null or empty row gives a (.., 0, D) dataset, as
allennlp's ``embed_batch`` does for an empty sentence, a null row's marked by the dataset attribute
``null`` (``NULL_ATTR``, True; an empty row's has none), as the Parquet output's null vectors
differ from an empty list; both counted (``null_rows``, ``empty_rows``). Invalid UTF-8 bytes are
dropped and counted (``invalid_utf8``), as the Parquet output does. With ``use_sentence_keys`` a
sentence must be a dataset name: a null, empty, repeated sentence or one holding '/' or NUL is an
error naming its row. One difference: our biLM is stateless, so a sentence's vectors do not
depend on the sentences before it (allennlp carries each batch row's LSTM state into the next
batch of 64 lines; its first batch is what we compute).

The one engine computes the vectors (``inference.Embedder``: windows of long sentences, batches
under ``--max-batch-tokens``), ``sort_window_rows`` sentences at a time. The output protocol
is the Parquet output's: a job holds OUT's lock (``.OUT.lock`` beside it, deleted when the job
finishes: a second job on the same OUT is refused while the first runs) and writes a temporary file of its own, fsynced and
renamed over OUT at the end (``storage.atomic``), so OUT is either the whole result or untouched.
"""
from __future__ import annotations

import itertools
import json
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import h5py

from corpora.files import input_format
from storage.atomic import WriteGuard, atomic_path, remove_stale_temporaries
from elmo_core.errors import InputError
from storage.locations import is_uri
from elmo_core.whitespace import split_tokens
from inference.run_settings import RunSettings

from .claim_first import RunMaker
from .os_errors import os_errors
from .options import PARQUET_ONLY, EmbedOptions
from .errors import NonFiniteError
from .progress import note
from .lock import OutputLock
from .rows import row_values
from .input_bytes import text_lines
from .source import InputFile, file_tokens, input_batches, scan_inputs

if TYPE_CHECKING:  # loaded once the inputs are checked (and never by `elmo info`, which reads a file's metadata)
    from inference import Embedder
    from inference.model_run import ModelRun

SENTENCE_TO_INDEX = "sentence_to_index"
NULL_ATTR = "null"  # a null row's dataset attribute: its (.., 0, D) vectors are no empty sentence's


def is_text_input(spec: str | Path) -> bool:
    path = Path(spec)
    return path.is_file() and input_format(path) == "text"


def text_sentences(path: Path) -> Iterator[tuple[str, list[str], str]]:
    """(sentence, tokens, where) per line of a text file."""
    with open(path, "rb") as f:
        for n, line in enumerate(text_lines(f, path)):  # the lines the Parquet door reads (input_bytes)
            sentence = line.strip()
            if not sentence:
                raise InputError(f"{path}: line {n + 1} is empty; `allennlp elmo` files hold one sentence per "
                                 f"line (dataset keys are line indexes): remove empty lines")
            yield sentence, split_tokens(sentence), f"{path}: line {n + 1}"


def parquet_sentences(files: list[InputFile], opts: EmbedOptions,
                      counts: dict) -> Iterator[tuple[str | None, list[str], str]]:
    """(sentence or None for a null row, tokens, where) per row of the inputs' ``files``
    (``scan_inputs``), in order; ``counts['invalid_utf8']`` counts the strings whose invalid bytes
    were dropped."""
    column = opts.tokens_column or opts.text_column
    for file in files:
        row = 0
        for batch in input_batches(file, opts):
            values, bad = row_values(batch.column(column), opts.tokens_column is not None, column)
            counts["invalid_utf8"] += bad
            for i, value in enumerate(values):
                tokens = value if opts.tokens_column or value is None else split_tokens(value)
                text = None if value is None else " ".join(value) if opts.tokens_column else value.strip()
                yield text, tokens or [], f"{file.path}: row {row + i} (column '{column}')"
            row += batch.num_rows


def _check_options(opts: EmbedOptions, out: Path) -> None:
    values, defaults = opts.to_dict(), EmbedOptions().to_dict()
    given = [k for k in PARQUET_ONLY if values[k] != defaults[k]]
    if given:
        named = ["--pool (or --output default: TF-Hub's name for the mix pooled by mean)" if k == "pool" else
                 "--" + k.replace("_", "-") for k in given]
        raise InputError(f"--format hdf5 writes allennlp elmo's layout, which has no place for "
                         f"{', '.join(named)}; leave them out or use --format parquet")
    if out.is_dir():
        raise InputError(f"{out}: is a directory; --format hdf5 writes one file (e.g. OUT.hdf5)")
    if out.exists() and not _is_earlier_output(out):
        raise InputError(f"{out}: exists and is not an earlier elmo embed --format hdf5 output (an input or a model's "
                         f"weights, perhaps); --format hdf5 replaces only those: choose another --out, or remove the "
                         f"file")


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # an hdf5 file's first bytes (with no user block)
WRITER_ATTR = "elmo_embed"  # the root attribute marking a file this module wrote (allennlp's readers see datasets only)


def _is_earlier_output(path: Path) -> bool:
    """Whether ``path`` is a file this module wrote: its root attribute (``WRITER_ATTR``), or, written
    before the attribute, an hdf5 file of datasets only with ``sentence_to_index`` among them.
    A model's weights (groups of datasets) or any other file is not."""
    if not path.is_file():
        return False
    with open(path, "rb") as raw:
        if raw.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
            return False
    try:
        with h5py.File(path, "r") as f:
            return WRITER_ATTR in f.attrs or (SENTENCE_TO_INDEX in f and all(
                isinstance(f.get(k, getlink=True), h5py.HardLink) and isinstance(f[k], h5py.Dataset) for k in f))
    except OSError:  # the signature, then a damaged file: not one to replace unasked
        return False


def output_info(path: Path) -> dict | None:
    """What a file this module wrote holds, read from its metadata (no vectors): its sentences, how
    they are keyed, the request it recorded (None: written before the record), and the vectors' as
    one dataset has them (``schema.vectors_of``'s keys; a file of no sentences: None); None for any
    other file. No model is recorded: the file holds allennlp's datasets and the request alone."""
    if not _is_earlier_output(path):
        return None
    with h5py.File(path, "r") as f:
        indexed = SENTENCE_TO_INDEX in f
        first = f["0"] if indexed and "0" in f else next((f[k] for k in f if k != SENTENCE_TO_INDEX), None)
        shape, dtype = (first.shape, first.dtype.name) if first is not None else ((), None)
        try:
            request = json.loads(f.attrs[WRITER_ATTR]).get("request") if WRITER_ATTR in f.attrs else None
        except (ValueError, TypeError, AttributeError):  # a damaged mark: the datasets still read
            request = None
        sentences = len(f) - indexed
    vectors = {"pooled": False, "layers": shape[0] if len(shape) == 3 else None, "dim": shape[-1], "dtype": dtype} \
        if len(shape) in (2, 3) else None
    return {"kind": "elmo embed hdf5 output", "path": str(path), "sentences": sentences,
            "keyed_by": "line index" if indexed else "sentence", "request": request, "vectors": vectors}


def embed_to_hdf5(input: str | Path, out: str | Path, /, model: ModelRun | str | Path | RunMaker,
                  use_sentence_keys: bool = False, **options: Any) -> dict:
    """Write ``out`` in allennlp elmo's layout (see the module doc); return counts and timing.
    ``model`` and ``options``: as ``pipelines.job.embed_parquet``'s.

    Shape: sentence i -> dataset str(i): (L+1, T_i, D) for output 'all', else (T_i, D).
    """
    settings, rest = RunSettings.split(options)
    return write_hdf5(input, out, RunMaker.of(model, settings, remote=False), EmbedOptions.coerce(rest),
                      use_sentence_keys)


def write_hdf5(input: str | Path, out: str | Path, maker: RunMaker, opts: EmbedOptions,
               use_sentence_keys: bool = False) -> dict:
    """``embed_to_hdf5`` with its records made: the door's (the CLI's) entry."""
    if is_uri(out):
        raise InputError(f"{out}: --format hdf5 writes a local file (h5py needs a file system); write it locally "
                         f"and copy it, or use --format parquet")
    out = Path(out)
    _check_options(opts, out)
    text_input = is_text_input(input)
    files = [] if text_input else scan_inputs(input, opts)  # a missing or bad INPUT is named before the model loads
    tokens = file_tokens(Path(input).stat().st_size, 0) if text_input else sum(f.expected_tokens for f in files)
    counts = {"sentences": 0, "tokens": 0, "null_rows": 0, "empty_rows": 0, "invalid_utf8": 0}
    run, opts = opts.settle(maker(None, tokens))  # the budget asked where asked, the run's where not
    sentences = text_sentences(Path(input)) if text_input else parquet_sentences(files, opts, counts)
    from inference import Embedder

    note(f"loading the model {run.describe()}", opts.quiet)
    start = time.perf_counter()
    with os_errors(out.parent, "rerun the same command"):
        out.parent.mkdir(parents=True, exist_ok=True)  # as OUTPUT_DIR is made for the shards
        with OutputLock.for_file(out) as lock:
            try:
                remove_stale_temporaries(out)  # of a killed job on this OUT: none is alive while the lock is ours
                with atomic_path(out, tidied=True) as tmp, closing(WriteGuard(tmp)) as guard:
                    with Embedder(run.open(), policy=opts.policy(run.batch.rows)) as embedder, \
                            h5py.File(guard, "w") as f:
                        _write(f, embedder, sentences, opts, use_sentence_keys, counts, guard)
                    guard.check()  # the metadata libhdf5 wrote as it closed the file, too
            finally:
                lock.finished()  # one file, whole or untouched: nothing to resume, so no lock file is left
    result = {**counts, "output": str(out), "seconds": round(time.perf_counter() - start, 3), "run": run.to_dict()}
    if not opts.quiet:
        print(f"wrote {out}: {counts['sentences']:,} sentences, {counts['tokens']:,} tokens ({counts['null_rows']:,} "
              f"null, {counts['empty_rows']:,} empty) in {result['seconds']:.1f} s"
              + (f"; {counts['invalid_utf8']:,} strings had invalid UTF-8 bytes, dropped" if counts["invalid_utf8"]
                 else ""), file=sys.stderr)
    return result


def _write(f: h5py.File, embedder: Embedder, sentences: Iterator[tuple[str | None, list[str], str]],
           opts: EmbedOptions, use_sentence_keys: bool, counts: dict, guard: WriteGuard) -> None:
    index: dict[str, str] = {}
    f.attrs[WRITER_ATTR] = json.dumps({"request": opts.vectors.to_dict()})
    for chunk in iter(lambda: list(itertools.islice(sentences, opts.sort_window_rows)), []):  # until none is left
        if use_sentence_keys:
            for sentence, _, where in chunk:
                _check_key(sentence, where, index.get(sentence or ""))
                index[sentence] = where  # type: ignore[index]
        try:
            vectors = embedder.vectors([t for _, t, _ in chunk], opts.vectors)  # the job's request, made once
        except NonFiniteError as e:
            advice = NonFiniteError.advice(opts.vectors.dtype, opts.vectors.gamma, flags=True)
            raise NonFiniteError(f"{chunk[e.row][2]}: {advice}", counts["sentences"] + e.row) from None
        for (sentence, toks, where), v in zip(chunk, vectors):
            n = counts["sentences"]  # v in the request's dtype (``Embedder.vectors``)
            _put(f, sentence if use_sentence_keys else str(n), v, None if sentence is None else len(toks), counts)
            if not use_sentence_keys:
                index[sentence or ""] = str(n)
            counts["sentences"], counts["tokens"] = n + 1, counts["tokens"] + len(toks)
        guard.check()  # a full disk stops the job here; libhdf5 never saw the failed write
    if not use_sentence_keys:
        f.create_dataset(SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype(), data=[json.dumps(index)])


def _put(f: h5py.File, key: str, vectors: Any, tokens: int | None, counts: dict) -> None:
    """One row's dataset (``tokens``: None for a null row, marked by ``NULL_ATTR``); a null or empty
    row counted."""
    dataset = f.create_dataset(key, data=vectors)
    if tokens is None:
        dataset.attrs[NULL_ATTR] = True
    name = "null_rows" if tokens is None else "empty_rows" if tokens == 0 else None
    if name is not None:
        counts[name] += 1


def _check_key(key: str | None, where: str, earlier: str | None) -> None:
    """A sentence as a dataset name (--use-sentence-keys)."""
    fix = "leave out --use-sentence-keys to key by index"
    if not key:
        raise InputError(f"{where}: the sentence is {'null' if key is None else 'empty'}; with --use-sentence-keys "
                         f"each sentence names its dataset: drop such rows or {fix}")
    if earlier is not None:
        raise InputError(f"{where} repeats {earlier} ({key[:60]!r}); with --use-sentence-keys every sentence must "
                         f"be unique ({fix})")
    if "/" in key or "\0" in key or key in (".", SENTENCE_TO_INDEX):
        raise InputError(f"{where} ({key[:60]!r}) cannot be an hdf5 dataset name ('/' separates groups, NUL ends "
                         f"a name); {fix}")
