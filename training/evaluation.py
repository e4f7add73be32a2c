"""A run's evaluations: held-out perplexity and the training perplexity it is compared with, both
scored as the model is used (stateless, full softmax; ``training.perplexity``).

* Periodic: at each checkpoint, the first ``--valid-sentences`` of --valid and the first
  ``--train-eval-sentences`` of the training corpus.
* Final: the whole --valid (or ``--final-valid-sentences``). With ``--max-minutes`` the run's time
  includes it: ``plan_final`` times the scoring of a few batches, estimates the final evaluation
  (capped to as many sentences as fit in a quarter of the run), announces it, and shortens the
  training limit by it. The estimate only plans: the final evaluations (valid, then the training
  text's) run against the run's deadline (``--max-minutes`` from the command's start, less
  ``EXIT_S`` for the summary and the exit), measured as they run: no batch starts that would end
  after it, so a machine slower than timed gets fewer sentences scored, and a warning, not a
  longer run. A limit too short to train in, or an evaluation cut, is said in the summary's
  warnings. Long evaluations print a progress line with an ETA.
* The summary reports held-out over training perplexity and warns when it is above ``GAP_WARN``.
"""
from __future__ import annotations

import time
from dataclasses import replace
from itertools import islice
from typing import Callable

from .corpus import iter_sentences
from .distributed import any_true, max_all
from .perplexity import perplexity
from .progress import Limits, clock

GAP_WARN = 1.5  # held-out / training perplexity above this: the model fits its training text much better
FINAL_SHARE = 0.25  # at most this share of --max-minutes goes to the final evaluation
PROGRESS_EVERY_S = 10.0
EXIT_S = 1.0  # of --max-minutes kept for what follows the final evaluation: the summary, the exit


class Evaluator:
    """The evaluations of one run; ``trainer`` is its ``training.trainer.Trainer`` (model, options,
    progress, metric logger)."""

    def __init__(self, trainer, log: Callable[[str], None]) -> None:  # noqa: ANN001 (the trainer imports this)
        self.t, self.log = trainer, log
        self.plan: dict = {"sentences": trainer.opts.final_valid_sentences, "reserved_s": 0.0}
        self.warnings: list[str] = []
        self._last: tuple[int, dict | None] | None = None  # (step, whole-valid result) of the last periodic eval

    def _score(self, path: str, max_sentences: int | None, label: str, total: int | None = None,
               deadline: float | None = None) -> dict:
        o, last = self.t.opts, [time.perf_counter(), time.perf_counter()]

        def progress(sentences: int, predictions: int) -> None:
            now = time.perf_counter()
            if total and now - last[1] >= PROGRESS_EVERY_S:
                last[1] = now
                eta = (now - last[0]) / max(sentences, 1) * (total - sentences)
                self.log(f"{label}: {sentences:,} / {total:,} sentences  ETA {clock(eta)}")

        return perplexity(self.t.lm, path, self.t.vocab, o.eval_batch_size, max_sentences, o.column, o.device,
                          progress=progress, deadline=deadline)

    def _evaluate(self, group: str, path: str, max_sentences: int | None, total: int | None = None,
                  deadline: float | None = None) -> dict | None:
        name = "valid" if group == "valid" else "train (own text)"
        if deadline is not None and time.perf_counter() >= deadline:
            self._warn(f"no time was left for the final {name} evaluation within --max-minutes "
                       f"{self.t.opts.max_minutes:g}: the run took longer than planned (a busy machine?); "
                       f"`elmo perplexity` scores the model afterwards")
            return None
        result = self._score(path, max_sentences, f"{name} evaluation", total, deadline)
        if result.pop("cut_by_deadline", False):
            planned = f" of {max_sentences:,}" if max_sentences is not None else ""
            self._warn(f"the final {name} evaluation stopped at {result['sentences']:,}{planned} sentences to "
                       f"end within --max-minutes {self.t.opts.max_minutes:g} (scoring ran slower than timed: a "
                       f"busy machine?); its perplexity is over those sentences")
        self.log(f"{name}  step {self.t.progress.step}  perplexity fwd {result['forward']:.2f} bwd "
                 f"{result['backward']:.2f} mean {result['mean']:.2f}  ({result['predictions']:,} predictions, "
                 f"stateless, full softmax)")
        self.t.metrics.record(group, self.t.progress.step, {f"ppl_{k}": result[k] for k in ("forward", "backward", "mean")},
                              {f"{group}_predictions": result["predictions"], f"{group}_sentences": result["sentences"]})
        return result

    def periodic(self) -> None:
        o = self.t.opts
        result = None
        if self.t.dist.is_main:
            if o.valid:
                result = self._evaluate("valid", o.valid, o.valid_sentences)
            if o.train_eval_sentences:
                self._evaluate("train_eval", o.train, o.train_eval_sentences)
        whole = result is not None and (o.valid_sentences is None or result["sentences"] < o.valid_sentences)
        if any_true(self.t.dist, whole):
            self._last = (self.t.progress.step, result)

    def _warn(self, warning: str) -> None:
        self.warnings.append(warning)
        self.log(f"warning: {warning}")

    def final(self) -> dict:
        """The summary's evaluation part: valid, train_eval, valid_over_train, warnings."""
        o, out = self.t.opts, {"valid": None, "train_eval": None, "valid_over_train": None, "warnings": self.warnings}
        if not self.t.dist.is_main:
            return out
        # the time.perf_counter() the final evaluations end by
        deadline = None if o.max_minutes is None else time.perf_counter() + o.max_minutes * 60 - self.t.elapsed() - EXIT_S
        if o.valid and self._last is not None and self._last[0] == self.t.progress.step:
            out["valid"] = self._last[1]  # this step's periodic eval already covered the whole valid set
        elif o.valid:
            out["valid"] = self._evaluate("valid", o.valid, self.plan["sentences"], self.plan.get("total"), deadline)
        if o.train_eval_sentences:
            out["train_eval"] = self._evaluate("train_eval", o.train, o.train_eval_sentences, deadline=deadline)
        if out["valid"] and out["train_eval"]:
            gap = out["valid_over_train"] = out["valid"]["mean"] / out["train_eval"]["mean"]
            self.log(f"held-out / training perplexity: {gap:.2f}")
            if gap > GAP_WARN:
                self._warn(f"held-out perplexity is {gap:.2f}x the training perplexity (both stateless, full "
                           f"softmax): the model fits its training text much better than new text (overfitting, "
                           f"or --valid is from another domain)")
        return out

    def plan_final(self, limits: Limits) -> Limits:
        """With --max-minutes and --valid: estimate the final evaluation, cap it to FINAL_SHARE of the
        run, announce it, and return the limits with the training time shortened by it."""
        o = self.t.opts
        reserved = 0.0
        if o.max_minutes is not None and o.valid and self.t.dist.is_main:
            self.log("final evaluation: timing a few batches of --valid to reserve its time within --max-minutes")
            reserved = self._estimate(o.max_minutes * 60)
        reserved = max_all(self.t.dist, reserved)
        self.plan["reserved_s"] = reserved
        if o.max_minutes is not None and self.t.dist.is_main and \
                self.t.elapsed() + reserved + EXIT_S >= o.max_minutes * 60:
            self._warn(f"--max-minutes {o.max_minutes:g} cannot fit this run: its start took "
                       f"{self.t.elapsed():.0f} s and the final evaluation needs about {reserved:.0f} s, which leaves "
                       f"no time to train; raise --max-minutes (or lower --final-valid-sentences)")
        if not reserved:
            return limits
        return replace(limits, minutes=max(o.max_minutes - reserved / 60, 0.0))

    def _estimate(self, budget_s: float) -> float:
        o = self.t.opts
        lengths = [len(s) + 1 for s in islice(iter_sentences(o.valid, o.column), o.final_valid_sentences)]
        sentences, predictions = len(lengths), sum(lengths)  # predictions: a sentence's tokens and </S>
        probe = min(sentences, 2 * o.eval_batch_size)
        self._score(o.valid, o.eval_batch_size, "warm-up")  # first calls allocate and pick kernels
        t0 = time.perf_counter()
        probe_predictions = self._score(o.valid, probe, "timing")["predictions"]
        per_prediction = (time.perf_counter() - t0) / max(probe_predictions, 1)
        train_eval = o.train_eval_sentences * predictions / max(sentences, 1)  # scored at the end too
        estimate = per_prediction * (predictions + train_eval) * 1.1 + 5.0  # margin, and the model's export
        if estimate > FINAL_SHARE * budget_s:
            keep = max(int(sentences * (FINAL_SHARE * budget_s - 5.0) / (estimate - 5.0)), 1)
            self.log(f"final evaluation: the whole --valid ({sentences:,} sentences) would take about "
                     f"{clock(estimate)}; scoring its first {keep:,} sentences to stay within --max-minutes "
                     f"(--final-valid-sentences sets it)")
            sentences, estimate = keep, FINAL_SHARE * budget_s
        self.plan.update(sentences=sentences, total=sentences, estimate_s=round(estimate, 1))
        self.log(f"final evaluation: {sentences:,} sentences of --valid, about {clock(estimate)}; training "
                 f"stops at {clock(budget_s - estimate)} so that the run ends within --max-minutes {o.max_minutes:g}")
        return estimate
