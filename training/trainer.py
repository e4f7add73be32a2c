"""``elmo train`` as a recipe (torchtune's shape): ``setup_*`` build the run's parts, ``run`` is
the loop; checkpoints go through ``Checkpointer``, metrics through ``MetricLogger``; the batchings
(``--batching``) are ``training.data``'s.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from elmo_core import ElmoConfig, LstmState
from elmo_core.bounds import MAX_COUNT, check_count
from elmo_core.errors import SettingError
from storage.atomic import atomic_dir, write_json_atomic
from elmo_core.host_to_device import to_device
from elmo_core.kinds import Precision
from formats import save_model
from inference.registry import check_device
from runtime import deterministic_algorithms, flushing_denormals, use_threads

from .checkpoint import Checkpointer, json_tensor, latest_step, load_optimizer, optimizer_tensors, tensor_json
from .corpus import check_corpus
from .data import BpttBatcher, SentenceBatcher, SentenceStream
from .distributed import any_true, barrier, init_from_env, max_all, sum_all
from .errors import CheckpointError, TrainingError
from .perplexity import SOFTMAX_NAME, save_softmax
from .evaluation import Evaluator
from .init_from import extend_vocabulary, init_source, load_initial_weights
from .model import LanguageModel
from .objective import Candidates, LogUniformSampler
from .optim import Recipe, resolve
from .options import MAX_UNROLL, PRECISION_REASONS, SOFTMAX_UPDATES, TrainOptions, default_precision
from .progress import DeviceTotals, Limits, MetricLogger, Progress, log_line
from .run_dir import CHECKPOINTS_DIR, check_run_dir
from .segments import StepPlan
from .sparse_softmax import SoftmaxRows, SparseSoftmax, clip_grad_norm_
from .vocab import Vocab, build_vocab


class Trainer:
    """One process of a run (rank ``dist.rank`` of ``dist.world``)."""

    def __init__(self, opts: TrainOptions, log: Callable[[str], None] = print, started: float | None = None,
                 resume: bool = False) -> None:
        self._t0 = time.perf_counter() if started is None else started  # --max-minutes counts from here
        self.opts, self.log, self.resume = opts, log, resume
        self.dist = init_from_env(opts.device)
        self.out, self.device = Path(opts.out), torch.device(opts.device)
        check_run_dir(self.out, resume, {"--text": opts.train, "--valid": opts.valid})
        for flag, corpus in (("--text", opts.train), ("--valid", opts.valid)):
            if corpus is not None:  # a missing --valid was found once training had ended
                check_corpus(corpus, opts.column, flag)
        barrier(self.dist)  # every rank has looked before the main one writes
        self.say(f"{use_threads(opts.threads)}; setting up the run in {self.out}")
        default = opts.precision == default_precision(opts.device)
        self.say(f"precision {PRECISION_REASONS[opts.precision] if default else opts.precision + ' (--precision)'}")
        self.recipe = self.setup_recipe()
        self.source = init_source(opts.init_from, opts.vocab, opts.softmax) if opts.init_from else None
        architecture = self.setup_architecture()
        self.vocab = self.setup_vocab()
        self.config = architecture.with_training(n_tokens_vocab=len(self.vocab))
        self.lm, self.net = self.setup_model()
        self.sampler, self.sparse = self.setup_softmax()
        self.optimizer = self.recipe.build([p for p in self.lm.parameters() if p.requires_grad])
        self.batcher = self.setup_data()
        self.checkpointer = Checkpointer(self.out / "checkpoints", self.dist, opts.keep_checkpoints)
        self.metrics = MetricLogger(self.out, self.dist.is_main, opts.tensorboard, log)
        self.evaluator = Evaluator(self, log)
        torch.manual_seed(opts.seed * 1000 + self.dist.rank)  # dropout
        self.limits = Limits(opts.max_tokens, opts.max_steps, opts.max_minutes)
        self.state: LstmState | None = None
        self.progress = Progress()
        self._totals = DeviceTotals.zeros(self.device)

    # ---- setup ------------------------------------------------------------------------------
    def setup_recipe(self) -> Recipe:
        o = self.opts
        recipe = resolve(o.recipe, o.optimizer, o.lr, o.warmup_steps, o.lr_decay, o.lr_final, o.batching)
        if o.softmax_updates not in SOFTMAX_UPDATES:
            raise TrainingError(f"unknown --softmax-updates {o.softmax_updates!r}; use one of {SOFTMAX_UPDATES}")
        if o.lr_decay not in (None, "none") and not any(
                v is not None for v in (o.lr_decay_tokens, o.max_tokens, o.max_steps, o.max_minutes)):
            raise TrainingError("--lr-decay needs a horizon: give --lr-decay-tokens, --max-tokens, --max-steps "
                                "or --max-minutes")
        return recipe

    def setup_vocab(self) -> Vocab:
        """--vocab, the run's own vocab.txt, or one built by the main rank; saved as RUN_DIR/vocab.txt."""
        o, path = self.opts, self.out / "vocab.txt"
        vocab = None
        if o.vocab and self.source is None:
            vocab = Vocab.load(o.vocab)
            if self.resume and path.is_file() and Vocab.load(path).tokens != vocab.tokens:
                raise CheckpointError(f"--vocab {o.vocab} is not the run's vocabulary ({path}): a resume trains on "
                                      f"the words and ids it started with; leave --vocab out or give that file")
        elif any_true(self.dist, path.is_file()):  # collective: every rank takes the same branch
            vocab = Vocab.load(path)
        elif self.dist.is_main:
            self.say(f"building the vocabulary from {o.train}")
            if self.source is None:
                vocab = build_vocab(o.train, o.min_count, o.max_vocab, o.column)
            elif o.extend_vocab:
                vocab = extend_vocabulary(self.source.vocab, o.train, o.min_count, o.column)
            else:
                vocab = self.source.vocab
        if self.dist.is_main and not path.is_file():
            self.out.mkdir(parents=True, exist_ok=True)
            vocab.save(path)
        barrier(self.dist)  # the main rank's vocab.txt is there for the others
        return vocab or Vocab.load(path)

    def setup_architecture(self) -> ElmoConfig:
        """The architecture (``--options`` or ``--init-from``'s) with the flags' training values,
        checked before anything is written."""
        o = self.opts
        if self.source is not None and o.options:
            raise TrainingError("--options and --init-from both name an architecture; leave --options out")
        base = ElmoConfig.from_json(self.source.files.options if self.source is not None else o.options)
        tr = base.training
        settled = {"batch_size": o.batch_size or tr.batch_size, "unroll_steps": o.unroll or tr.unroll_steps,
                   "n_epochs": o.epochs or tr.n_epochs}  # a flag's value was checked; an options.json one is here
        for (name, value), flag in zip(settled.items(), ("--batch-size", "--unroll", "--epochs")):
            try:
                check_count(name, value, high=MAX_UNROLL if name == "unroll_steps" else MAX_COUNT)
            except SettingError as e:
                where = self.source.files.options if self.source is not None else o.options
                raise TrainingError(f"{where}: training {e}; fix it there, or give {flag}") from None
        return base.with_training(**settled)

    def setup_model(self) -> tuple[LanguageModel, torch.nn.Module]:
        lm = LanguageModel(self.config, len(self.vocab)).initialise(self.opts.seed)
        if self.source is not None:
            load_initial_weights(lm, self.source, self.vocab)
        lm.to(self.device)
        if self.opts.compile:  # fused steps: one kernel for each step's element-wise work (docs/training.md)
            lm.bilm.lstm.compile_cell()
        # find_unused_parameters: with packed segments the ranks' autograd graphs differ in shape (their
        # own segment packings), and DDP's static bucket check then stops at step 2 although every
        # parameter gets its gradient (tests/training/test_ddp.py: the same weights as one process).
        return lm, (DistributedDataParallel(lm, find_unused_parameters=True) if self.dist.enabled else lm)

    def setup_softmax(self) -> tuple[LogUniformSampler | None, SparseSoftmax | None]:
        """The sampler (sampled softmax when the vocabulary is larger than the samples) and, with
        sparse updates, the softmax rows' own optimizer (neither autograd nor DDP then touch them)."""
        n_neg = self.config.training.n_negative_samples_batch
        sampler = LogUniformSampler(len(self.vocab), self.opts.seed) if 0 < n_neg < len(self.vocab) else None
        if sampler is None or self.opts.softmax_updates != "sparse":
            return sampler, None
        self.lm.softmax_w.requires_grad_(False)
        self.lm.softmax_b.requires_grad_(False)
        return sampler, SparseSoftmax(self.lm.softmax_w, self.lm.softmax_b, self.recipe.optimizer)

    def setup_data(self) -> BpttBatcher | SentenceBatcher:
        o, tr = self.opts, self.config.training
        limited = any(v is not None for v in (o.max_tokens, o.max_steps, o.max_minutes))
        epochs = o.epochs if o.epochs is not None else (None if limited else tr.n_epochs)
        # Every rank reads the whole stream and builds the global batch's rows, keeping its own slice:
        # the ranks together train on exactly the batch one process would (same rows too).
        stream = SentenceStream(o.train, epochs, o.column, o.shuffle_buffer, o.seed)
        B, W, r = tr.batch_size, self.dist.world, self.dist.rank
        if B % W:
            raise TrainingError(f"batch size {B} is not divisible by the {W} ranks")
        keep, chars = (r * B // W, (r + 1) * B // W), self.config.char_cnn.max_characters_per_token
        if self.recipe.batching == "sentences":
            return SentenceBatcher(stream, self.vocab, B, chars, keep)
        return BpttBatcher(stream, self.vocab, B, tr.unroll_steps, chars, keep, reset=self.recipe.batching == "packed")

    # ---- the learning rate ------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds trained in this run, before this process and in it."""
        return self.progress.elapsed + time.perf_counter() - self._t0

    def current_lr(self) -> float:
        """The learning rate for the next step: a function of progress, so resume continues the schedule.
        The lr horizon is ``--lr-decay-tokens``, else the nearest of the run's limits (none: no decay);
        with ``--max-minutes`` the run's training time is the largest over the ranks, so that they agree."""
        if self.opts.lr_decay_tokens is not None:
            return self.recipe.lr_at(self.progress.step, self.progress.tokens / self.opts.lr_decay_tokens)
        elapsed = max_all(self.dist, self.elapsed()) if self.limits.minutes else self.elapsed()
        return self.recipe.lr_at(self.progress.step, self.limits.done(self.progress, elapsed))

    # ---- one step ---------------------------------------------------------------------------
    def train_step(self, batch) -> tuple[torch.Tensor, int]:
        """Forward, backward, clip, update. Returns per-direction NLL sums (2,) on the device and the
        token count. What reads the batch's data (the candidates, segments, the predicted positions,
        the softmax rows) is found on the host and copied without a host wait: on CUDA the step
        queues its work and returns without waiting for the device."""
        self.lm.train()
        self.optimizer.zero_grad(set_to_none=True)
        n_neg = self.config.training.n_negative_samples_batch
        dev = self.device
        cands = (self.sampler.sample(n_neg), self.sampler.sample(n_neg)) if self.sampler else None
        rows = self.sparse.gather(batch.targets[:, batch.mask], cands) if self.sparse and cands else None
        cands = tuple(Candidates(to_device(c.ids, dev), c.tries) for c in cands) if cands else None
        state = self.state if batch.stateful else None
        plan = StepPlan.of(batch, self.lm.bilm.encoder, dev)
        precision = Precision.of(self.opts.precision)  # fp32 or bf16 (TRAIN_PRECISIONS): autocast in bf16
        with torch.autocast(dev.type, dtype=precision.torch, enabled=precision.reduced):
            # Each rank divides by (all ranks' tokens / ranks): DDP's gradient mean is then the
            # gradient of the global mean NLL, however the tokens fall between ranks.
            norm = batch.total_tokens / self.dist.world
            loss, sums, final = self.net(to_device(batch.chars, dev), to_device(batch.targets, dev),
                                         to_device(batch.mask, dev), state, cands, self.sampler, norm, rows,
                                         plan=plan)
        self._totals.finite &= torch.isfinite(loss.detach())  # read with the metrics (read_totals)
        loss.backward()
        if self.progress.step < self.opts.freeze_encoder_steps:  # zero gradients leave Adam and Adagrad still
            for p in self.lm.bilm.parameters():
                p.grad = None
        self._totals.grad_norm += self._update(rows).detach().float().to(dev)
        self.state = LstmState(final.h.detach().float(), final.c.detach().float()) if batch.stateful else None
        return sums, batch.n_tokens

    def step(self, batch) -> None:
        """One training step and its progress; the loss sums stay on the device (``read_totals``)."""
        sums, n = self.train_step(batch)
        t = self._totals
        t.nll += sums.float()
        t.steps += 1
        p = self.progress
        total = batch.total_tokens if self.dist.enabled else n  # every rank knows the global batch's tokens
        p.step, p.tokens, p.nll_tokens = p.step + 1, p.tokens + total, p.nll_tokens + total

    def read_totals(self) -> float:
        """The device's sums since the last read, summed over ranks, into the progress (one host read
        every ``--log-every`` steps). Returns the mean gradient norm; a loss that was not finite stops the run."""
        t = self._totals
        nll_f, nll_b, grad, finite = sum_all(self.dist, torch.cat([t.nll, t.grad_norm[None],
                                                                   t.finite.float()[None]])).tolist()
        steps, first = t.steps, self.progress.step - t.steps + 1
        self._totals = DeviceTotals.zeros(self.device)
        if finite < self.dist.world:
            raise TrainingError(f"steps {first}-{self.progress.step}: the loss is not finite; lower --lr")
        p = self.progress
        p.nll = [p.nll[0] + nll_f, p.nll[1] + nll_b]
        return grad / max(steps * self.dist.world, 1)

    def _update(self, rows: SoftmaxRows | None) -> torch.Tensor:
        """Clip the whole gradient's norm, then the optimizer step (and the softmax rows' one).
        Returns the gradient's norm before clipping."""
        clip = self.config.training.all_clip_norm_val
        lr = self.current_lr()
        if rows is None:
            norm = torch.nn.utils.clip_grad_norm_(self.lm.parameters(), clip)
        else:
            rows = self.sparse.reduce(self.dist, rows)
            norm = clip_grad_norm_([p for p in self.lm.parameters() if p.requires_grad], rows, clip)
            self.sparse.step(rows, lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return norm

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        self.read_totals()  # a non-finite loss since the last read stops the run before its weights are saved
        local = {"rng.torch": torch.get_rng_state()}
        if self.state is not None:
            local.update({"lstm.h": self.state.h, "lstm.c": self.state.c})
        main = None
        if self.dist.is_main:
            opt_tensors, opt_meta = optimizer_tensors(self.optimizer)
            sparse_tensors, sparse_meta = self.sparse.state_tensors() if self.sparse is not None else ({}, None)
            sampler = {"rng.sampler": self.sampler.state()} if self.sampler is not None else {}
            tensors = {**{f"model.{k}": v for k, v in self.lm.state_dict().items()}, **opt_tensors, **sampler,
                       **sparse_tensors}
            meta = {"step": self.progress.step, "tokens": self.progress.tokens, "world": self.dist.world,
                    "elapsed": self.elapsed(), "optimizer": opt_meta, "softmax_updates": sparse_meta,
                    "options": asdict(self.opts), "config": self.config.to_dict(), "batching": self.recipe.batching,
                    "horizon": self._horizon(), **self._identity()}
            main = (tensors, meta)
        local["data.state"] = json_tensor(self.batcher.state_dict())  # a large shuffle buffer: past a header's 100 MB
        return self.checkpointer.save(self.progress.step, main, (local, {"rank": self.dist.rank}))

    def _horizon(self) -> dict:
        """What the lr schedule decays over (recorded in checkpoints and run.json)."""
        o = self.opts
        if o.lr_decay_tokens is not None:
            return {"lr_decay_tokens": o.lr_decay_tokens}
        return {"max_tokens": self.limits.tokens, "max_steps": self.limits.steps, "train_minutes": self.limits.minutes}

    def _identity(self) -> dict:
        """What a resume must train with as the checkpoint did, beyond the architecture: the
        vocabulary's words in their order (ids), and the optimizer (its state's form)."""
        return {"vocab_sha256": self.vocab.sha256(), "optimizer_name": self.recipe.optimizer}

    def load_checkpoint(self) -> int:
        expect = {"world": self.dist.world, "config": self.config.to_dict(), "batching": self.recipe.batching,
                  "softmax_updates": None if self.sparse is None else "sparse", **self._identity()}
        step, tensors, meta, local, local_meta = self.checkpointer.load(expect)
        self.lm.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
        load_optimizer(self.optimizer, tensors, meta["optimizer"])
        if self.sparse is not None:
            self.sparse.load_state(tensors, meta["softmax_updates"])
        if self.sampler is not None:
            self.sampler.set_state(tensors["rng.sampler"])
        torch.set_rng_state(local["rng.torch"])
        self.batcher.load_state_dict(tensor_json(local["data.state"]) if "data.state" in local else local_meta["data"])
        if "lstm.h" in local:
            self.state = LstmState(local["lstm.h"].to(self.device), local["lstm.c"].to(self.device))
        self.progress = Progress(step=step, tokens=meta["tokens"], elapsed=meta["elapsed"])
        before = meta.get("horizon")
        if before is not None and before != self._horizon() and self.recipe.lr_decay != "none" and self.dist.is_main:
            self.log(f"the lr horizon moves: the checkpoint decayed over {_describe(before)}, this run over "
                     f"{_describe(self._horizon())}; the lr continues from {self.current_lr():.3g} (give "
                     "--lr-decay-tokens to keep one schedule over resumes)")
        return step

    # ---- the loop ---------------------------------------------------------------------------
    def _log_progress(self) -> None:
        p, (t_last, tokens_last) = self.progress, self._last_log
        now = time.perf_counter()
        rate = (p.tokens - tokens_last) / max(now - t_last, 1e-9)
        self._last_log = (now, p.tokens)
        softmax = "sampled" if self.sampler else "full"
        grad = self.read_totals()  # the loss sums since the last line, which the line shows
        if self.dist.is_main:
            s_per_step = (now - self._t0) / (p.step - self._step0) if p.step > self._step0 else None
            self.log(log_line(p, rate, self.limits.eta(p, self.elapsed(), rate, s_per_step), softmax))
        f, b = (x / max(p.nll_tokens, 1) for x in p.nll)
        self.metrics.record("train", p.step, {
            "loss": 0.5 * (f + b), "loss_forward": f, "loss_backward": b, "ppl_forward": math.exp(min(f, 50)),
            "ppl_backward": math.exp(min(b, 50)), "lr": self.current_lr(), "tokens_per_s": rate, "grad_norm": grad},
            {"tokens": p.tokens, "elapsed_s": self.elapsed(), "softmax": softmax})
        p.nll, p.nll_tokens = [0.0, 0.0], 0

    def say(self, text: str) -> None:
        """A line on what the run is doing (the main rank's)."""
        if self.dist.is_main:
            self.log(text)

    def run(self) -> dict:
        """Train to the run's limits (from its latest checkpoint where it resumes), then export and
        evaluate; the summary. torch's deterministic kernels throughout: the same options, corpus
        and seed give the same bits on one machine (docs/training.md, *Reproducibility*)."""
        with deterministic_algorithms():
            if self.resume:
                step = self.load_checkpoint()
                self.metrics.drop_after(step)
                if self.dist.is_main:
                    self.log(f"resuming from step {step}")
            self.limits = self.evaluator.plan_final(self.limits)
            self._write_run_json()
            self._step0 = self.progress.step
            self._last_log = (time.perf_counter(), self.progress.tokens)
            self.say(f"training: vocabulary {len(self.vocab):,} words, {sum(p.numel() for p in self.lm.parameters()):,} "
                     f"parameters")
            while not any_true(self.dist, self.limits.reached(self.progress, self.elapsed())):
                batch = self.batcher.next_batch()
                if any_true(self.dist, batch is None):
                    break
                self.step(batch)
                p = self.progress
                if p.step % self.opts.log_every == 0:
                    self._log_progress()
                elif p.step == self._step0 + 1:
                    self.say(f"step {p.step}: the first step took {time.perf_counter() - self._last_log[0]:.1f} s; "
                             f"progress every {self.opts.log_every} steps")
                if self.opts.checkpoint_every and p.step % self.opts.checkpoint_every == 0:
                    self.save_checkpoint()
                    self.evaluator.periodic()
            return self._finish()

    def _write_run_json(self) -> None:
        if self.dist.is_main:  # RUN_DIR is there: setup_vocab wrote vocab.txt in it
            info = {"options": asdict(self.opts), "config": self.config.to_dict(), "vocab_size": len(self.vocab),
                    "world": self.dist.world, "softmax": "sampled" if self.sampler else "full",
                    "recipe": asdict(self.recipe), "horizon": self._horizon(), "final_eval": self.evaluator.plan}
            write_json_atomic(self.out / "run.json", info, sort_keys=False)

    def _finish(self) -> dict:
        if self.progress.nll_tokens:
            self._log_progress()
        train_s = self.elapsed()
        if self.progress.step > 0 and self.checkpointer.latest() != self.progress.step:
            self.save_checkpoint()
        model_dir = self.export(self.out / "model")
        summary = {"step": self.progress.step, "tokens": self.progress.tokens, "model": str(model_dir),
                   **self.evaluator.final(), "epoch": self.batcher.stream.epoch,
                   "read": asdict(self.batcher.stream.stats), "batching": self.recipe.batching,
                   "train_s": train_s, "elapsed_s": self.elapsed()}
        if self.dist.is_main:
            write_json_atomic(self.out / "summary.json", summary, sort_keys=False)
        self.metrics.close()
        return summary

    def export(self, model_dir: Path) -> Path:
        """options.json + weights.hdf5 (published layout), softmax.hdf5 and vocab.txt, published as one
        directory (``atomic_dir``: an earlier run's stays whole until this one is, never a mix)."""
        if self.dist.is_main:
            with atomic_dir(model_dir, "vocab.txt", replace=True) as tmp:
                save_model(self.lm.bilm.cpu(), tmp, "hdf5")
                self.lm.to(self.device)
                save_softmax(self.lm, tmp / SOFTMAX_NAME)
                self.vocab.save(tmp / "vocab.txt")
        barrier(self.dist)
        return model_dir


def _describe(h: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v:.4g}"
                     for k, v in h.items() if v is not None) or "no limit"


def train(opts: TrainOptions, resume: bool = False, log: Callable[[str], None] = print,
          started: float | None = None) -> dict:
    """Train (or resume) a run; returns the summary also written to RUN_DIR/summary.json.
    ``started``: the ``time.perf_counter()`` that --max-minutes counts from (default: now)."""
    check_device(opts.device)  # a GPU this process cannot reach: named before anything is read or written
    with flushing_denormals():  # saturated gates' denormals slow CPU kernels ~10x (runtime.settings)
        try:
            return Trainer(opts, log, started, resume).run()
        except KeyboardInterrupt as e:  # SIGINT, and the CLI's SIGTERM (a KeyboardInterrupt): what was kept
            step = latest_step(Path(opts.out) / CHECKPOINTS_DIR, 1) if Path(opts.out).is_dir() else None
            e.add_note(f"kept: the checkpoint of step {step:,} in {opts.out}; the same command with --resume "
                       f"continues from it" if step is not None else f"no checkpoint was written in {opts.out}")
            raise
