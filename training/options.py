"""``TrainOptions``: everything a run needs, one field per ``elmo train`` flag.

Each field's metadata holds its help and group; ``elmo_cli.cmd_train`` generates the flags from
these fields (as ``elmo serve``'s limits from ``ServeLimits``), so a new option is one field here.
A run saves its options in RUN_DIR/run.json and in every checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from elmo_core.bounds import MAX_SEED, check_count, check_flags, check_number, setting
from elmo_core.errors import InputError, SettingError
from elmo_core.names import TRAIN_PRECISIONS
from elmo_core.mix_settings import FLOAT32_MAX
from inference.run_settings import check_device_name
from runtime import check_threads

from .optim import BATCHINGS, LR_DECAYS, OPTIMIZERS, RECIPES
from .vocab import SPECIALS

SOFTMAX_UPDATES = ("sparse", "dense")
MAX_TOKENS = 2**53  # a run's tokens: counted exactly in a float64
MAX_MINUTES = 10**7  # about 19 years
# A row's steps a batch: backpropagation through this many steps is far past any recipe's (bilm-tf's 20),
# and a larger value (a typo: 100,000,000) asked numpy for a 149 GiB batch, a traceback
MAX_UNROLL = 4096
FROM_OPTIONS = "options.json's"


@dataclass
class TrainOptions:
    """None means: from options.json, the recipe, or (with --init-from) the model's own."""

    train: str = setting(None, "training corpus: text/.gz/Parquet file, directory or glob", "data", required=True,
                         meaning="text")
    options: str | None = setting(None, "options.json (default: the shipped small-512.json; with --init-from: the "
                                        "model's)")
    out: str = setting(None, "run directory", required=True, meaning="out")
    valid: str | None = setting(None, "held-out corpus for perplexity", "data")
    vocab: str | None = setting(None, "vocabulary file (<S>, </S>, <UNK> and words by frequency); default: built "
                                "(with --init-from: the model's vocabulary, default MODEL_DIR/vocab.txt)", "data")
    min_count: int = setting(3, "built vocabulary (or --extend-vocab): words seen at least N times", "data")
    max_vocab: int | None = setting(None, "built vocabulary: at most N entries", "data")
    column: str | None = setting(None, "the Parquet column of whitespace-tokenized text or list<string> tokens "
                                 "(default: tokens, text or sentence)", "data", meaning="text_column")
    shuffle_buffer: int = setting(10000, "sentences in the shuffle buffer (0: corpus order)", "data")
    max_tokens: int | None = setting(None, "stop after N training tokens", "limits")
    max_steps: int | None = setting(None, "stop after N steps", "limits")
    epochs: int | None = setting(None, "passes over the corpus (default: options' n_epochs when no other limit)",
                                 "limits")
    max_minutes: float | None = setting(None, "the whole run's time over resumes, the final evaluation included "
                                        "(training stops early enough for it)", "limits", meaning="max_minutes")
    batch_size: int | None = setting(None, "global batch (rows), default from options", "batches")
    unroll: int | None = setting(None, "steps per batch row, default from options (20)", "batches")
    batching: str | None = setting(None, "packed: continuous rows, the state reset to zero at every sentence start "
                                   "(the default recipe's); stateful: the state carried across sentences (bilm-tf's); "
                                   "sentences: whole sentences, padded", "batches", BATCHINGS)
    recipe: str = setting("default", "the optimizer, schedule and batching (the flags override its fields)",
                          "optimizer", tuple(RECIPES))
    optimizer: str | None = setting(None, "the recipe's; another keeps its usual lr (adam 1e-3, adagrad 0.2) unless "
                                    "--lr is given", "optimizer", OPTIMIZERS)
    lr: float | None = setting(None, "peak learning rate (the recipe's)", "optimizer")
    warmup_steps: int | None = setting(None, "linear warm-up of the lr over N steps (the recipe's)", "optimizer")
    lr_decay: str | None = setting(None, "decay the lr to lr * --lr-final over --lr-decay-tokens, else over the run's "
                                   "nearest limit (the recipe's)", "optimizer", LR_DECAYS)
    lr_final: float | None = setting(None, "final lr as a fraction of --lr (the recipe's)", "optimizer")
    lr_decay_tokens: int | None = setting(None, "the decay's horizon in training tokens (fixed over resumes)",
                                          "optimizer")
    softmax_updates: str = setting("sparse", "with the sampled softmax: update only the softmax rows a step reads "
                                   "(sparse, as bilm-tf; Adam is then lazy on those rows) or all of them (dense)",
                                   "optimizer", SOFTMAX_UPDATES)
    seed: int = setting(0, "seed of the initialisation, shuffling, sampling and dropout")
    device: str = setting("cpu", "cpu, cuda or cuda:N", meaning="device")
    checkpoint_every: int = setting(500, "steps between checkpoints and periodic evaluations (0: none; a run's last "
                                    "step is always saved)", "checkpoints")
    keep_checkpoints: int = setting(2, "checkpoints kept", "checkpoints")
    log_every: int = setting(10, "steps between progress lines (and reads of the loss sums the device adds up)",
                             "metrics")
    valid_sentences: int | None = setting(2000, "sentences of --valid in periodic evaluations", "metrics")
    final_valid_sentences: int | None = setting(None, "sentences of --valid in the final evaluation (default: all; "
                                                "with --max-minutes, as many as fit in a quarter of the run)",
                                                "metrics")
    train_eval_sentences: int = setting(500, "training sentences scored stateless with each evaluation (0: none): the "
                                        "training perplexity held-out perplexity is compared with", "metrics")
    eval_batch_size: int = setting(32, None, "metrics", meaning="eval_batch_size")
    tensorboard: bool = setting(True, "TensorBoard event files in RUN_DIR/tensorboard (the tensorboard extra)",
                                "metrics")
    compile: bool = setting(False, "fused, compiled LSTM steps (elmo_core.fused_sequence): fewer kernels a step, more host "
                           "time (slower on a host-bound GPU step, docs/training.md)", "speed")
    precision: str | None = setting(None, "bf16: bf16 autocast (parameters and the carried state stay fp32); default "
                                    "bf16 on CUDA (it trains as well as fp32), fp32 on the CPU", "speed",
                                    TRAIN_PRECISIONS, meaning="precision")
    threads: int | None = setting(None, "torch threads", "speed", meaning="threads")
    init_from: str | None = setting(None, "model directory to start from (published options.json + weights, or ours)",
                                    "fine-tuning")
    softmax: str | None = setting(None, "its softmax weights (softmax/W (V, P), softmax/b (V,)); default: MODEL_DIR's "
                                  "*softmax*.hdf5, else a fresh softmax", "fine-tuning")
    extend_vocab: bool = setting(False, "add the corpus words seen >= --min-count times that the vocabulary lacks (new "
                                 "softmax rows)", "fine-tuning")
    freeze_encoder_steps: int = setting(0, "train only the softmax for the first N steps (for a fresh softmax)",
                                        "fine-tuning")

    def __post_init__(self) -> None:
        if self.train is None or self.out is None:
            raise TypeError("TrainOptions needs train and out")
        check_flags(self)
        check_device_name(self.device)
        if self.precision is None:
            self.precision = default_precision(self.device)
        if self.precision not in TRAIN_PRECISIONS:
            raise InputError(f"--precision {self.precision}: training runs in {' or '.join(TRAIN_PRECISIONS)}")
        _check_numbers(self)
        _check_combinations(self)


def default_precision(device: str) -> str:
    """The training precision when --precision is not given: bf16 autocast on CUDA, where it trains
    as well as fp32 (perplexity within 2 % after the same tokens, tests/training/test_precision.py)
    at about twice the products' speed; fp32 on the CPU."""
    return "bf16" if device.startswith("cuda") else "fp32"


PRECISION_REASONS = {"bf16": "bf16 autocast, the default on CUDA: it trains as well as fp32 (perplexity within 2 % "
                             "after the same tokens) with faster products",
                     "fp32": "fp32, the default on the CPU"}


def check_max_minutes(minutes: float | None, optional: str | None = None) -> None:
    """A training time in minutes (``elmo train``, ``default-model``, ``engine``, ``demo``), checked
    where it is given, also where a model already there makes the training unnecessary."""
    check_number("max_minutes", minutes, 0, MAX_MINUTES, low_open=True, optional=optional)


def _check_combinations(o: TrainOptions) -> None:
    """No flag that this run would ignore: SettingError naming it and what it needs."""
    needs = [("extend_vocab", o.extend_vocab, "init_from"), ("softmax", o.softmax is not None, "init_from"),
             ("max_vocab", o.max_vocab is not None and o.vocab is not None, None)]
    for name, given, needed in needs:
        if given and needed is not None and getattr(o, needed) is None:
            raise SettingError(f"`{name}` applies to fine-tuning a model: give `{needed}` too, or leave `{name}` out")
        if given and needed is None:
            raise SettingError(f"`{name}` sizes a vocabulary built from the corpus; `vocab` gives one: leave one out")
    if o.lr_decay == "none":
        for name in ("lr_final", "lr_decay_tokens"):
            if getattr(o, name) is not None:
                raise SettingError(f"`{name}` shapes the lr's decay, and `lr_decay` is none: leave one out")


def _check_numbers(o: TrainOptions) -> None:
    """Every number finite and in its range, None where the flag may be left out (what that means
    is in the message); no bad value falls back to a default."""
    check_count("min_count", o.min_count)
    check_count("max_vocab", o.max_vocab, len(SPECIALS) + 1, optional="every word seen `min_count` times")
    check_count("shuffle_buffer", o.shuffle_buffer, 0, zero="corpus order")
    for name in ("max_tokens", "lr_decay_tokens"):
        check_count(name, getattr(o, name), high=MAX_TOKENS, optional="no such limit")
    check_count("max_steps", o.max_steps, optional="no such limit")
    check_count("epochs", o.epochs, optional=f"{FROM_OPTIONS} n_epochs when no other limit is given")
    check_max_minutes(o.max_minutes, optional="no time limit")
    check_count("batch_size", o.batch_size, optional=f"{FROM_OPTIONS} batch_size")
    check_count("unroll", o.unroll, high=MAX_UNROLL, optional=f"{FROM_OPTIONS} unroll_steps")
    check_number("lr", o.lr, 0, FLOAT32_MAX, optional="the recipe's")
    check_count("warmup_steps", o.warmup_steps, 0, zero="no warm-up", optional="the recipe's")
    check_number("lr_final", o.lr_final, 0, 1, optional="the recipe's")
    check_count("seed", o.seed, 0, MAX_SEED)
    check_count("checkpoint_every", o.checkpoint_every, 0, zero="none before the last step")
    for name in ("keep_checkpoints", "log_every", "eval_batch_size"):
        check_count(name, getattr(o, name))
    check_count("valid_sentences", o.valid_sentences, optional="all of `valid`")
    check_count("final_valid_sentences", o.final_valid_sentences, optional="all of `valid`, or what fits `max_minutes`")
    check_count("train_eval_sentences", o.train_eval_sentences, 0, zero="none")
    check_count("freeze_encoder_steps", o.freeze_encoder_steps, 0, zero="none")
    check_threads(o.threads)
