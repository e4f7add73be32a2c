"""The default model: the shipped config (``default_options_path``), that config trained on the sotu
speeches (``train_default_model``: `elmo engine` without ``--model`` and `elmo demo` get their model
from it), and the model this repository ships (``models/default``, ``shipped_model``; the one
command that rebuilds it: ``build_default_model``).
"""
from __future__ import annotations

import math
import shutil
import time
from importlib import resources
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from corpora.sotu import sotu_sentences
from corpora.sotu_text import split_speeches, write_sotu_corpus
from storage.atomic import atomic_dir, atomic_path, check_can_publish, read_json_object, write_json_atomic
from elmo_core.bounds import MAX_SEED, check_count
from inference import Embedder
from inference.errors import NonFiniteError

from .errors import TrainingError
from .options import check_max_minutes
from .run_dir import has_checkpoint, holds_run_files_only
from .trainer import TrainOptions, train

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "default"
MIN_COSINE = 0.9999
CHECK_SENTENCES = 300
WEIGHT_FILES = ("weights.hdf5", "softmax.hdf5")
CARD = "card.json"
DEFAULT_OPTIONS = "small-512.json"
REUSE_KEYS = ("max_minutes", "seed", "device", "threads")  # what a reused run must have been trained with


def default_options_path() -> str:
    """The shipped default config, small-512.json (char filters totalling 512, 1 highway, LSTM 512 /
    projection 128, 2 layers, no dropout): chosen by measurement for short CPU runs (docs/training.md);
    small.json is the same with LSTM 1024 and dropout 0.1."""
    return str(resources.files("training") / "configs" / DEFAULT_OPTIONS)


def train_default_model(work: str | Path, minutes: float, log: Callable[[str], None] = print,
                        **overrides: object) -> Path:
    """The shipped config trained for ``minutes`` on the sotu speeches (split by speech, written to
    WORK/corpus); returns its model directory, WORK/train/model. A model already there is reused.
    ``overrides``: TrainOptions fields (default: 2,000 held-out sentences in the final evaluation).
    """
    work = Path(work)
    corpus, run = work / "corpus", work / "train"
    fields = {"options": default_options_path(), "final_valid_sentences": 2000} | overrides  # a quick final check
    opts = TrainOptions(train=str(corpus / "train"), valid=str(corpus / "valid"), out=str(run), max_minutes=minutes,
                        **fields)  # checked before anything is written
    if (run / "model" / "options.json").is_file():
        _check_reused(run, opts)
        log(f"reusing the model trained before at {run / 'model'}")
        return run / "model"
    if not (corpus / "valid").is_dir():
        write_sotu_corpus(corpus)
    log(f"training the default model for {minutes:g} min ({opts.options}) into {run}")
    if run.is_dir() and not has_checkpoint(run) and holds_run_files_only(run):  # its run, stopped before a checkpoint
        log(f"starting over: {run} holds no checkpoint")
        shutil.rmtree(run)
    train(opts, resume=has_checkpoint(run), log=log)
    if not (run / "model" / "options.json").is_file():
        raise TrainingError(f"training wrote no model directory at {run / 'model'}")
    return run / "model"


def _check_reused(run: Path, opts: TrainOptions) -> None:
    """A model trained before is reused only where it was trained as asked (its run.json's options):
    else the card would record settings it was not trained with. TrainingError naming both."""
    try:
        recorded = read_json_object(run / "run.json").get("options") or {}
    except FileNotFoundError:
        recorded = {}
    differ = [f"{k} {recorded.get(k)} there, {getattr(opts, k)} asked" for k in REUSE_KEYS
              if recorded.get(k) != getattr(opts, k)]
    if differ:
        raise TrainingError(f"{run / 'model'} was trained with other settings ({'; '.join(differ)}): give the "
                            f"same ones, another --work-dir, or delete {run} to train again")


def shipped_model() -> Path | None:
    """The repository's default model directory, if this checkout has it."""
    return SHIPPED if (SHIPPED / "options.json").is_file() else None


def write_half(src: Path, dst: Path) -> None:
    """Copy a model directory with every float dataset of its weight files stored as float16
    (the loaders read them back as float32)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        if f.name not in WEIGHT_FILES:
            shutil.copy(f, dst / f.name)
            continue
        with h5py.File(f, "r") as fin, atomic_path(dst / f.name) as tmp, h5py.File(tmp, "w") as fout:
            def copy(name: str, obj: object) -> None:
                if isinstance(obj, h5py.Dataset):
                    fout.create_dataset(name, data=obj[...].astype(np.float16) if obj.dtype.kind == "f" else obj[...])
            fin.visititems(copy)


def min_cosine(a_dir: Path, b_dir: Path, sentences: list[list[str]]) -> float:
    """The smallest cosine between the two models' vectors of the same token and layer; -inf where
    either gives a vector that is not finite (a float16 copy that overflows: the float32 one is kept)."""
    outs = []
    for d in (a_dir, b_dir):
        with Embedder.from_files(d) as e:
            try:
                vectors = e.embed_sentences(sentences, output="all")
            except NonFiniteError:
                return -math.inf
            outs.append(np.concatenate([v.transpose(1, 0, 2) for v in vectors]))
    a, b = (o.astype(np.float64) for o in outs)  # (N, L+1, D) each
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)  # (N, L+1)
    return float(cos.min())


def build_default_model(out: str | Path, work: str | Path, minutes: float, seed: int = 0,
                        log: Callable[[str], None] = print, **overrides: object) -> dict:
    """Train the default model into WORK (the default recipe and config on the sotu speeches, split
    by speech: every 10th held out; seeded, for a fixed time; the whole held-out split scored
    stateless), then write the shipped directory OUT (whole or not at all): the weights in float16
    when every token's vector, in every layer, keeps a cosine of at least ``MIN_COSINE`` with the
    float32 model's on held-out sentences (else in float32), and its card (``card.json``: the
    command, seed, split, tokens, time and perplexities); returns the card. ``overrides``: more
    TrainOptions fields (tests)."""
    check_max_minutes(minutes)  # checked also where a model trained before is reused: the card names them
    check_count("seed", seed, 0, MAX_SEED)
    out, work = Path(out), Path(work)
    if out.exists() and not (out / CARD).is_file():  # replaced whole below: only a directory this command wrote
        raise TrainingError(f"--out {out} exists and is not a model elmo default-model wrote (no {CARD}); it would "
                            f"be replaced whole: choose another --out")
    try:
        check_can_publish(out)  # before the run's minutes, not after them
    except OSError as e:
        raise TrainingError(f"--out {out}: the model cannot be written there ({e.strerror}: {e.filename}); choose "
                            f"another --out") from None
    started = time.time()
    model = train_default_model(work, minutes, log, seed=seed, **overrides)
    summary = read_json_object(work / "train" / "summary.json")
    if not summary.get("valid"):
        raise TrainingError(f"{work / 'train' / 'summary.json'}: the run scored no held-out text")
    _, valid_ids = split_speeches()
    check = [t for _, t in zip(range(CHECK_SENTENCES), (t for _, t in sotu_sentences(valid_ids)))]
    with atomic_dir(out, CARD, replace=True) as tmp:  # the directory appears whole or not at all
        write_half(model, tmp)
        cosine = min_cosine(model, tmp, check)
        storage = "float16"
        if cosine < MIN_COSINE:
            shutil.rmtree(tmp)
            shutil.copytree(model, tmp)
            storage = "float32"
        settings = "".join(f" --{k} {overrides[k]}" for k in ("device", "threads") if overrides.get(k) not in (None, "cpu"))
        card = {"command": f"elmo default-model --max-minutes {minutes:g} --seed {seed}{settings}",
                "recipe": "elmo train's defaults (training.default_model: small-512.json, Adam 0.005, packed batching)",
                "corpus": "sotu speeches, split by speech: every 10th held out (corpora.sotu_text)",
                "seed": seed, "minutes": minutes, "steps": summary["step"], "tokens": summary["tokens"],
                "train_s": round(summary["train_s"], 1), "held_out": summary["valid"],
                "train_eval": summary.get("train_eval"), "storage": storage,
                "storage_min_cosine": cosine, "storage_check": f"{len(check)} held-out sentences, every token and layer",
                "built": time.strftime("%Y-%m-%d", time.gmtime(started))}
        write_json_atomic(tmp / CARD, card)
    log(f"default model: {out} ({storage}, min cosine {cosine:.6f} against float32; held-out perplexity "
        f"{summary['valid']['mean']:.1f})")
    return card
