"""``TrainOptions``: everything a run needs, one field per ``elmo train`` flag.

Each field's metadata holds its help and group; ``elmo_cli.cmd_train`` generates the flags from
these fields (as ``elmo serve``'s limits from ``ServeLimits``), so a new option is one field here.
A run saves its options in RUN_DIR/run.json and in every checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from elmo_core.errors import InputError
from elmo_core.names import TRAIN_PRECISIONS

from .optim import BATCHINGS, LR_DECAYS, OPTIMIZERS, RECIPES

SOFTMAX_UPDATES = ("sparse", "dense")


def _opt(default, help: str, group: str = "run", choices: tuple | None = None, **meta):  # noqa: A002
    """A field and its flag's help, group, choices and (``meaning``) the shared flag it is
    (``elmo_cli.vocabulary``)."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, **meta})


@dataclass
class TrainOptions:
    """None means: from options.json, the recipe, or (with --init-from) the model's own."""

    train: str = _opt(None, "training corpus: text/.gz/Parquet file, directory or glob", "data", required=True)
    options: str | None = _opt(None, "options.json (default: the shipped small-512.json; with --init-from: the model's)")
    out: str = _opt(None, "run directory", required=True)
    valid: str | None = _opt(None, "held-out corpus for perplexity", "data")
    vocab: str | None = _opt(None, "vocabulary file (<S>, </S>, <UNK> and words by frequency); default: built "
                             "(with --init-from: the model's vocabulary, default MODEL_DIR/vocab.txt)", "data")
    min_count: int = _opt(3, "built vocabulary (or --extend-vocab): words seen at least N times", "data")
    max_vocab: int | None = _opt(None, "built vocabulary: at most N entries", "data")
    column: str | None = _opt(None, "the Parquet column of whitespace-tokenized text or list<string> tokens "
                              "(default: tokens, text or sentence)", "data", meaning="text_column")
    shuffle_buffer: int = _opt(10000, "sentences in the shuffle buffer (0: corpus order)", "data")
    max_tokens: int | None = _opt(None, "stop after N training tokens", "limits")
    max_steps: int | None = _opt(None, "stop after N steps", "limits")
    epochs: int | None = _opt(None, "passes over the corpus (default: options' n_epochs when no other limit)", "limits")
    max_minutes: float | None = _opt(None, "the whole run's time over resumes, the final evaluation included "
                                     "(training stops early enough for it)", "limits", meaning="max_minutes")
    batch_size: int | None = _opt(None, "global batch (rows), default from options", "batches")
    unroll: int | None = _opt(None, "steps per batch row, default from options (20)", "batches")
    batching: str | None = _opt(None, "packed: continuous rows, the state reset to zero at every sentence start "
                                "(the default recipe's); stateful: the state carried across sentences (bilm-tf's); "
                                "sentences: whole sentences, padded", "batches", BATCHINGS)
    recipe: str = _opt("default", "the optimizer, schedule and batching (the flags override its fields)",
                       "optimizer", tuple(RECIPES))
    optimizer: str | None = _opt(None, "the recipe's; another keeps its usual lr (adam 1e-3, adagrad 0.2) unless "
                                 "--lr is given", "optimizer", OPTIMIZERS)
    lr: float | None = _opt(None, "peak learning rate (the recipe's)", "optimizer")
    warmup_steps: int | None = _opt(None, "linear warm-up of the lr over N steps (the recipe's)", "optimizer")
    lr_decay: str | None = _opt(None, "decay the lr to lr * --lr-final over --lr-decay-tokens, else over the run's "
                                "nearest limit (the recipe's)", "optimizer", LR_DECAYS)
    lr_final: float | None = _opt(None, "final lr as a fraction of --lr (the recipe's)", "optimizer")
    lr_decay_tokens: int | None = _opt(None, "the decay's horizon in training tokens (fixed over resumes)", "optimizer")
    softmax_updates: str = _opt("sparse", "with the sampled softmax: update only the softmax rows a step reads "
                                "(sparse, as bilm-tf; Adam is then lazy on those rows) or all of them (dense)",
                                "optimizer", SOFTMAX_UPDATES)
    seed: int = _opt(0, "seed of the initialisation, shuffling, sampling and dropout")
    device: str = _opt("cpu", "cpu, cuda or cuda:N", meaning="device")
    checkpoint_every: int = _opt(500, "steps between checkpoints (and periodic evaluations)", "checkpoints")
    keep_checkpoints: int = _opt(2, "checkpoints kept", "checkpoints")
    log_every: int = _opt(10, "steps between progress lines", "metrics")
    valid_sentences: int | None = _opt(2000, "sentences of --valid in periodic evaluations", "metrics")
    final_valid_sentences: int | None = _opt(None, "sentences of --valid in the final evaluation (default: all; "
                                             "with --max-minutes, as many as fit in a quarter of the run)", "metrics")
    train_eval_sentences: int = _opt(500, "training sentences scored stateless with each evaluation (0: none): the "
                                     "training perplexity held-out perplexity is compared with", "metrics")
    eval_batch_size: int = _opt(32, "sentences a batch in evaluations", "metrics")
    tensorboard: bool = _opt(True, "TensorBoard event files in RUN_DIR/tensorboard (the tensorboard extra)", "metrics")
    compile: bool = _opt(False, "fused, compiled LSTM steps (elmo_core.fused_sequence; always on CUDA)", "speed")
    precision: str = _opt("fp32", "bf16: bf16 autocast (parameters and the carried state stay fp32)", "speed",
                          TRAIN_PRECISIONS, meaning="precision")
    threads: int | None = _opt(None, "torch threads", "speed", meaning="threads")
    init_from: str | None = _opt(None, "model directory to start from (published options.json + weights, or ours)",
                                 "fine-tuning")
    softmax: str | None = _opt(None, "its softmax weights (softmax/W (V, P), softmax/b (V,)); default: MODEL_DIR's "
                               "*softmax*.hdf5, else a fresh softmax", "fine-tuning")
    extend_vocab: bool = _opt(False, "add the corpus words seen >= --min-count times that the vocabulary lacks (new "
                              "softmax rows)", "fine-tuning")
    freeze_encoder_steps: int = _opt(0, "train only the softmax for the first N steps (for a fresh softmax)",
                                     "fine-tuning")

    def __post_init__(self) -> None:
        if self.train is None or self.out is None:
            raise TypeError("TrainOptions needs train and out")
        if self.precision not in TRAIN_PRECISIONS:
            raise InputError(f"--precision {self.precision}: training runs in {' or '.join(TRAIN_PRECISIONS)}")
