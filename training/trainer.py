"""``elmo train``: the training loop (stateful truncated BPTT or sentence batches), checkpoints,
exact resume, data-parallel ranks, progress and metrics, and the published-format output."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from elmo_core import ElmoConfig, LstmState, save_model
from elmo_core.lstm_cell import lstm_step

from . import checkpoint as ck
from .data import BpttBatcher, SentenceBatcher, SentenceStream
from .distributed import any_true, barrier, init_from_env, max_all, sum_all
from .errors import CheckpointError, TrainingError
from .evaluate import SOFTMAX_NAME, perplexity, save_softmax
from .init_from import extend_vocabulary, init_source, load_initial_weights
from .model import LanguageModel
from .objective import LogUniformSampler
from .optim import Recipe, resolve
from .progress import Limits, Progress, log_line
from .sparse_softmax import SoftmaxRows, SparseSoftmax, clip_grad_norm_
from .vocab import Vocab, build_vocab

SOFTMAX_UPDATES = ("sparse", "dense")


@dataclass
class TrainOptions:
    """Everything a run needs; saved as RUN_DIR/run.json. None means: from options.json."""

    train: str
    options: str | None  # None with init_from: the model's own
    out: str
    valid: str | None = None
    vocab: str | None = None
    min_count: int = 3
    max_vocab: int | None = None
    column: str | None = None
    max_tokens: int | None = None
    max_steps: int | None = None
    epochs: int | None = None
    max_minutes: float | None = None
    batch_size: int | None = None
    unroll: int | None = None
    recipe: str = "default"  # training.optim.RECIPES; the fields below override it
    lr: float | None = None
    optimizer: str | None = None
    warmup_steps: int | None = None
    lr_decay: str | None = None  # linear/cosine to lr * lr_final over lr_decay_tokens (else the run's limit)
    lr_final: float | None = None
    lr_decay_tokens: int | None = None
    softmax_updates: str = "sparse"  # with the sampled softmax: update only the rows a step reads
    seed: int = 0
    device: str = "cpu"
    bptt: bool = True
    shuffle_buffer: int = 10000
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 10
    valid_sentences: int | None = 2000
    final_valid_sentences: int | None = None  # None: the whole valid set at the end
    eval_batch_size: int = 32
    compile: bool = False
    bf16: bool = False
    threads: int | None = None
    init_from: str | None = None  # a model directory to continue pretraining (see training.init_from)
    softmax: str | None = None  # its softmax file
    extend_vocab: bool = False  # add the corpus words (>= min_count) its vocabulary lacks
    freeze_encoder_steps: int = 0  # train only the softmax for the first N steps


class Trainer:
    """One process of a run (rank ``dist.rank`` of ``dist.world``)."""

    def __init__(self, opts: TrainOptions, log: Callable[[str], None] = print) -> None:
        self.opts, self.log = opts, log
        self.limits = Limits(opts.max_tokens, opts.max_steps, opts.max_minutes)
        self.dist = init_from_env(opts.device)
        self.out = Path(opts.out)
        self.ckpt_dir = self.out / "checkpoints"
        if opts.threads:
            torch.set_num_threads(opts.threads)
        self.recipe: Recipe = resolve(opts.recipe, opts.optimizer, opts.lr, opts.warmup_steps, opts.lr_decay,
                                      opts.lr_final)
        if opts.softmax_updates not in SOFTMAX_UPDATES:
            raise TrainingError(f"unknown --softmax-updates {opts.softmax_updates!r}; use one of {SOFTMAX_UPDATES}")
        if opts.lr_decay not in (None, "none") and not self._has_horizon():
            raise TrainingError("--lr-decay needs a horizon: give --lr-decay-tokens, --max-tokens, --max-steps "
                                "or --max-minutes")
        # Saturated gates produce denormal floats, which make CPU kernels ~10x slower; flushing
        # them to zero (values below 1e-38) is numerically immaterial.
        torch.set_flush_denormal(True)
        self.source = init_source(opts.init_from, opts.vocab, opts.softmax) if opts.init_from else None
        self.vocab = self._vocab()
        self.config = self._config()
        self.device = torch.device(opts.device)
        self.lm = LanguageModel(self.config, len(self.vocab)).initialise(opts.seed)
        if self.source is not None:
            load_initial_weights(self.lm, self.source, self.vocab)
        self.lm.to(self.device)
        n_neg = self.config.training.n_negative_samples_batch
        self.sampler = LogUniformSampler(len(self.vocab), opts.seed) if 0 < n_neg < len(self.vocab) else None
        self.sparse = None
        if self.sampler is not None and opts.softmax_updates == "sparse":
            # SparseSoftmax updates (and, data-parallel, reduces) the softmax, not autograd nor DDP.
            self.sparse = SparseSoftmax(self.lm.softmax_w, self.lm.softmax_b, self.recipe.optimizer)
            self.lm.softmax_w.requires_grad_(False)
            self.lm.softmax_b.requires_grad_(False)
        self.optimizer = self.recipe.build(self._dense_params())
        self.batcher = self._batcher()
        self.net = DistributedDataParallel(self.lm) if self.dist.enabled else self.lm
        self.step_fn = self.net
        if opts.compile:  # the LSTM cell only: see docs/training.md (whole-model inductor code crashed)
            self.lm.bilm.lstm.train_cell = torch.compile(lstm_step, dynamic=False)
        torch.manual_seed(opts.seed * 1000 + self.dist.rank)  # dropout
        self.state: LstmState | None = None
        self.progress = Progress()
        self._t0 = time.perf_counter()  # run() restarts it
        self._full_eval: tuple[int, dict | None] | None = None

    # ---- setup ------------------------------------------------------------------------------
    def _vocab(self) -> Vocab:
        path = self.out / "vocab.txt"
        if self.opts.vocab and self.source is None:
            vocab = Vocab.load(self.opts.vocab)
        elif any_true(self.dist, path.is_file()):  # collective: every rank takes the same branch
            vocab = Vocab.load(path)
        else:
            vocab = None
            if self.dist.is_main:
                vocab = self._new_vocab()
                self.out.mkdir(parents=True, exist_ok=True)
                vocab.save(path)
            barrier(self.dist)
            vocab = vocab or Vocab.load(path)
        if self.dist.is_main and not path.is_file():
            self.out.mkdir(parents=True, exist_ok=True)
            vocab.save(path)
        return vocab

    def _new_vocab(self) -> Vocab:
        o = self.opts
        if self.source is None:
            return build_vocab(o.train, o.min_count, o.max_vocab, o.column)
        return extend_vocabulary(self.source.vocab, o.train, o.min_count, o.column) if o.extend_vocab else self.source.vocab

    def _config(self) -> ElmoConfig:
        o = self.opts
        if self.source is not None and o.options:
            raise TrainingError("--options and --init-from both name an architecture; leave --options out")
        base = ElmoConfig.from_json(self.source.files.options if self.source is not None else o.options)
        tr = base.training
        return base.with_training(
            n_tokens_vocab=len(self.vocab), batch_size=o.batch_size or tr.batch_size,
            unroll_steps=o.unroll or tr.unroll_steps, n_epochs=o.epochs or tr.n_epochs)

    def _dense_params(self) -> list[torch.nn.Parameter]:
        """What the (dense) optimizer updates: everything but the softmax when its rows are sparse."""
        return [p for p in self.lm.parameters() if p.requires_grad]

    def _has_horizon(self) -> bool:
        o = self.opts
        return any(v is not None for v in (o.lr_decay_tokens, o.max_tokens, o.max_steps, o.max_minutes))

    def _elapsed(self) -> float:
        """Seconds trained in this run, before this process and in it."""
        return self.progress.elapsed + time.perf_counter() - self._t0

    def horizon_done(self) -> float | None:
        """The fraction of the lr horizon trained: ``--lr-decay-tokens``, else the nearest of the
        run's limits; None without one. A function of progress (and, with ``--max-minutes``, of the
        run's training time, taken as the largest over the ranks so that they agree)."""
        if self.opts.lr_decay_tokens is not None:
            return self.progress.tokens / self.opts.lr_decay_tokens
        elapsed = max_all(self.dist, self._elapsed()) if self.limits.minutes else self._elapsed()
        return self.limits.done(self.progress, elapsed)

    def current_lr(self) -> float:
        """The learning rate for the next step: a function of progress, so resume continues the schedule."""
        return self.recipe.lr_at(self.progress.step, self.horizon_done())

    def _batcher(self) -> BpttBatcher | SentenceBatcher:
        o, tr = self.opts, self.config.training
        limited = any(v is not None for v in (o.max_tokens, o.max_steps, o.max_minutes))
        epochs = o.epochs if o.epochs is not None else (None if limited else tr.n_epochs)
        # Every rank reads the whole stream and builds the global batch's rows, keeping its own slice:
        # the ranks together train on exactly the batch one process would (same BPTT rows too).
        stream = SentenceStream(o.train, epochs, o.column, o.shuffle_buffer, o.seed)
        B, W, r = tr.batch_size, self.dist.world, self.dist.rank
        if B % W:
            raise TrainingError(f"batch size {B} is not divisible by the {W} ranks")
        keep, chars = (r * B // W, (r + 1) * B // W), self.config.char_cnn.max_characters_per_token
        if o.bptt:
            return BpttBatcher(stream, self.vocab, B, tr.unroll_steps, chars, keep)
        return SentenceBatcher(stream, self.vocab, B, chars, keep)

    # ---- one step ---------------------------------------------------------------------------
    def train_step(self, batch) -> tuple[torch.Tensor, int]:
        """Forward, backward, clip, update. Returns per-direction NLL sums (2,) and the token count."""
        self.lm.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_neg = self.config.training.n_negative_samples_batch
        cands = (self.sampler.sample(n_neg), self.sampler.sample(n_neg)) if self.sampler else None
        dev = self.device
        rows = self.sparse.gather(batch.targets[:, batch.mask], cands) if self.sparse and cands else None
        state = self.state if batch.stateful else None
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.opts.bf16):
            # Each rank divides by (all ranks' tokens / ranks): DDP's gradient mean is then the
            # gradient of the global mean NLL, however the tokens fall between ranks.
            norm = batch.total_tokens / self.dist.world
            loss, sums, final = self.step_fn(batch.chars.to(dev), batch.targets.to(dev), batch.mask.to(dev),
                                             state, cands, self.sampler, norm, rows)
        if not torch.isfinite(loss):
            raise TrainingError(f"step {self.progress.step + 1}: the loss is {loss.item()}; lower --lr")
        loss.backward()
        if self.progress.step < self.opts.freeze_encoder_steps:  # zero gradients leave Adam and Adagrad still
            for p in self.lm.bilm.parameters():
                p.grad = None
        self._update(rows)
        self.state = LstmState(final.h.detach().float(), final.c.detach().float()) if batch.stateful else None
        return sums, batch.n_tokens

    def _update(self, rows: SoftmaxRows | None) -> None:
        """Clip the whole gradient's norm, then the optimizer step (and the softmax rows' one)."""
        clip = self.config.training.all_clip_norm_val
        lr = self.current_lr()
        if rows is None:
            torch.nn.utils.clip_grad_norm_(self.lm.parameters(), clip)
        else:
            rows = self.sparse.reduce(self.dist, rows)
            clip_grad_norm_(self._dense_params(), rows, clip)
            self.sparse.step(rows, lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        step, r = self.progress.step, self.dist.rank
        local = {"rng.torch": torch.get_rng_state()}
        if self.state is not None:
            local.update({"lstm.h": self.state.h, "lstm.c": self.state.c})
        ck.write_atomic(ck.rank_path(self.ckpt_dir, step, r), local, {"data": self.batcher.state_dict(), "rank": r})
        barrier(self.dist)
        path = ck.main_path(self.ckpt_dir, step)
        if self.dist.is_main:
            tensors = {f"model.{k}": v for k, v in self.lm.state_dict().items()}
            opt_tensors, opt_meta = ck.optimizer_tensors(self.optimizer)
            tensors.update(opt_tensors)
            if self.sampler is not None:
                tensors["rng.sampler"] = self.sampler.state()
            sparse_tensors, sparse_meta = self.sparse.state_tensors() if self.sparse is not None else ({}, None)
            tensors.update(sparse_tensors)
            meta = {"step": step, "tokens": self.progress.tokens, "world": self.dist.world, "elapsed": self._elapsed(),
                    "optimizer": opt_meta, "softmax_updates": sparse_meta, "options": asdict(self.opts),
                    "config": self.config.to_dict()}
            ck.write_atomic(path, tensors, meta)
            ck.prune(self.ckpt_dir, self.opts.keep_checkpoints)
        barrier(self.dist)
        return path

    def _check_compatible(self, meta: dict) -> None:
        if meta["world"] != self.dist.world:
            raise CheckpointError(f"the checkpoint was written by {meta['world']} processes, this run has "
                                  f"{self.dist.world}; resume with the same number of processes")
        if (meta.get("softmax_updates") is None) != (self.sparse is None):
            raise CheckpointError("the checkpoint's softmax updates (--softmax-updates) differ from this run's; "
                                  "resume with the same ones")
        if meta["config"] != self.config.to_dict():
            raise CheckpointError("the checkpoint's architecture or training options differ from this run's "
                                  "(--options, --batch-size, --unroll, vocabulary); resume with the same ones")

    def load_checkpoint(self) -> int:
        step = ck.latest_step(self.ckpt_dir, self.dist.world)
        if step is None:
            raise CheckpointError(f"{self.ckpt_dir}: no complete checkpoint to resume from")
        tensors, meta = ck.read(ck.main_path(self.ckpt_dir, step))
        self._check_compatible(meta)
        model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        self.lm.load_state_dict(model)
        ck.load_optimizer(self.optimizer, tensors, meta["optimizer"])
        if self.sparse is not None:
            self.sparse.load_state(tensors, meta["softmax_updates"])
        if self.sampler is not None:
            self.sampler.set_state(tensors["rng.sampler"])
        local, lmeta = ck.read(ck.rank_path(self.ckpt_dir, step, self.dist.rank))
        torch.set_rng_state(local["rng.torch"])
        self.batcher.load_state_dict(lmeta["data"])
        self.state = LstmState(local["lstm.h"].to(self.device), local["lstm.c"].to(self.device)) if "lstm.h" in local else None
        self.progress = Progress(step=step, tokens=meta["tokens"], elapsed=meta["elapsed"])
        return step

    # ---- the loop ---------------------------------------------------------------------------
    def _metrics(self, record: dict) -> None:
        if self.dist.is_main:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _log_progress(self, t_start: float) -> None:
        p, (t_last, tokens_last) = self.progress, self._last_log
        rate = (p.tokens - tokens_last) / max(time.perf_counter() - t_last, 1e-9)
        self._last_log = (time.perf_counter(), p.tokens)
        if self.dist.is_main:
            s_per_step = (time.perf_counter() - t_start) / (p.step - self._step0) if p.step > self._step0 else None
            self.log(log_line(p, rate, self.limits.eta(p, self._elapsed(), rate, s_per_step)))
        f, b = (x / max(p.nll_tokens, 1) for x in p.nll)
        self._metrics({"step": p.step, "tokens": p.tokens, "tokens_per_s": rate, "train_loss": 0.5 * (f + b),
                       "train_ppl_fwd": math.exp(min(f, 50)), "train_ppl_bwd": math.exp(min(b, 50)),
                       "elapsed_s": self._elapsed(),
                       "softmax": "sampled" if self.sampler else "full"})
        p.nll, p.nll_tokens = [0.0, 0.0], 0

    def evaluate(self, max_sentences: int | None) -> dict | None:
        """Valid perplexity (full softmax) on rank 0, logged; None without --valid."""
        if self._full_eval is not None and self._full_eval[0] == self.progress.step:
            return self._full_eval[1]  # this step's periodic eval already covered the whole valid set
        result = None
        if self.opts.valid and self.dist.is_main:
            result = perplexity(self.lm, self.opts.valid, self.vocab, self.opts.eval_batch_size,
                                max_sentences, self.opts.column, self.opts.device)
            self.log(f"valid  step {self.progress.step}  perplexity fwd {result['forward']:.2f} "
                     f"bwd {result['backward']:.2f} mean {result['mean']:.2f}  ({result['predictions']:,} predictions)")
            self._metrics({"step": self.progress.step, **{f"valid_ppl_{k}" if k in ("forward", "backward", "mean")
                                                          else f"valid_{k}": v for k, v in result.items()}})
        whole = result is not None and (max_sentences is None or result["sentences"] < max_sentences)
        if any_true(self.dist, whole):
            self._full_eval = (self.progress.step, result)
        return result

    def run(self, resume: bool = False) -> dict:
        self._t0 = t_start = time.perf_counter()
        if resume:
            self.log(f"resuming from step {self.load_checkpoint()}") if self.dist.is_main else self.load_checkpoint()
        elif ck.latest_step(self.ckpt_dir, self.dist.world) is not None:
            raise CheckpointError(f"{self.out} already holds checkpoints; pass --resume or choose another --out")
        self._write_run_json()
        self._step0 = self.progress.step
        self._last_log = (t_start, self.progress.tokens)
        while not any_true(self.dist, self.limits.reached(self.progress, self._elapsed())):
            batch = self.batcher.next_batch()
            if any_true(self.dist, batch is None):
                break
            sums, n = self.train_step(batch)
            totals = sum_all(self.dist, torch.cat([sums.float().cpu(), torch.tensor([float(n)])]))
            p = self.progress
            p.step, p.tokens, p.nll_tokens = p.step + 1, p.tokens + int(totals[2]), p.nll_tokens + int(totals[2])
            p.nll = [p.nll[0] + float(totals[0]), p.nll[1] + float(totals[1])]
            if p.step % self.opts.log_every == 0:
                self._log_progress(t_start)
            if self.opts.checkpoint_every and p.step % self.opts.checkpoint_every == 0:
                self.save_checkpoint()
                self.evaluate(self.opts.valid_sentences)
        return self._finish()

    def _write_run_json(self) -> None:
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            info = {"options": asdict(self.opts), "config": self.config.to_dict(), "vocab_size": len(self.vocab),
                    "world": self.dist.world, "softmax": "sampled" if self.sampler else "full"}
            (self.out / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")

    def _finish(self) -> dict:
        if self.progress.nll_tokens:
            self._log_progress(self._t0)
        if self.progress.step > 0 and ck.latest_step(self.ckpt_dir, self.dist.world) != self.progress.step:
            self.save_checkpoint()
        model_dir = self.export(self.out / "model")
        valid = self.evaluate(self.opts.final_valid_sentences)
        summary = {"step": self.progress.step, "tokens": self.progress.tokens, "model": str(model_dir),
                   "valid": valid, "epoch": self.batcher.stream.epoch, "read": self.batcher.stream.stats.to_dict(),
                   "elapsed_s": self.progress.elapsed + time.perf_counter() - self._t0}
        if self.dist.is_main:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return summary

    def export(self, model_dir: Path) -> Path:
        """options.json + weights.hdf5 (published layout), softmax.hdf5 and vocab.txt."""
        if self.dist.is_main:
            save_model(self.lm.bilm.cpu(), model_dir, "hdf5")
            self.lm.to(self.device)
            save_softmax(self.lm, model_dir / SOFTMAX_NAME)
            self.vocab.save(model_dir / "vocab.txt")
        barrier(self.dist)
        return model_dir


def train(opts: TrainOptions, resume: bool = False, log: Callable[[str], None] = print) -> dict:
    """Train (or resume) a run; returns the summary also written to RUN_DIR/summary.json."""
    return Trainer(opts, log).run(resume)
