"""How the torch backend runs the biLM's recurrence, and ``--layout auto``: chosen by measurement.

The layouts (``elmo_core.names.LAYOUTS``), each computing what the reference computes:

- ``packed``: the sentences sorted by length, the active rows shrinking (``elmo_core.lstm.Packing``),
  each step eager and in place (``inference.fast_lstm``), on oneDNN weights packed once on a CPU.
- ``fused``: the same packing, each step two products and two compiled kernels
  (``inference.fused_lstm`` over ``elmo_core.fused_cell``); on a CPU the products on packed
  oneDNN weights and the kernels compiled by inductor's C++ backend (a C++ compiler is needed).
- ``rows``: a batch's sentences laid end to end in static rows, run a window of steps at a time
  (``inference.row_lstm``): replayed as CUDA graphs on CUDA; on a CPU the same windows run
  eagerly, each step two products on packed oneDNN weights and two compiled kernels, at most
  ``Layout.rows`` rows a step (``RowShape.rows``; each batch takes the power of two up to it
  that runs it fastest, ``RowShape.for_batch``).

``auto`` (the default): ``rows`` on CUDA. On a CPU the fastest of ``packed``, ``fused`` and ``rows``
at each of ``CPU_ROW_COUNTS`` (and, for a model whose matrices ``packed`` multiplies by plain
products, ``packed`` with every product on packed oneDNN weights: ``Layout.onednn``; which runs
faster depends on the CPU's BLAS) for this CPU model, precision, LSTM shape and thread count (and
whether the directions run on threads of their own, ``inference.directions``), measured
once on the recurrence alone (a random model of the same shape: the weights' values do not change
the time) and kept in the cache (``layouts.json`` under ``storage.locations.cache_root``, keyed by
``LAYOUTS_CODE`` too: figures of another version of this code are measured again). The faster
of the two eager ones (``packed``, ``packed`` on oneDNN) is the base; a compiled layout (``fused``,
``rows``) is taken only when it is ``FUSED_MARGIN`` faster than that base: never slower than
``packed`` (the fixed default it replaces) by more than noise. Every process that runs a compiled
layout first pays its kernels' warm-up (importing the compiler, tracing and loading each kernel's
variants: 8-13 s for the full-size model on an AMX Xeon, docs/performance.md), measured with the
layouts (``warmup_s``): a job whose expected tokens (``pipelines``: its inputs' text) the saving
per token would not repay it on keeps the eager base (``choose``); a run with no end in sight (a
server, an ``Embedder``) takes the faster. A model whose recurrent matrices are below
``MEASURED_MIN_WEIGHTS`` takes ``packed`` unmeasured (its steps are too small for any to matter,
and compiling would cost more than it saves).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from elmo_core import ElmoConfig
from storage.atomic import write_json_atomic
from elmo_core.errors import InputError
from elmo_core.names import LAYOUTS
from storage.locations import cache_root

from runtime import use_threads

from .directions import split
from .fast_lstm import packed_products
from .precision import cpu_model

# A compiled layout must measure this much faster than the faster eager one to be chosen: more than
# one measurement's turn-to-turn spread on a shared machine (+-10 %, docs/performance.md). fp32's
# fused and packed tie on a quiet AMX Xeon (0.96x-1.01x), and a measurement under load once took fused
# at 1.08x, which then ran 0.85x-0.9x packed end to end.
FUSED_MARGIN = 1.10
# From this many recurrent weights (P x 4C) a model's layouts are measured: the shipped model's 128 x
# 2,048 runs `packed` on oneDNN products 1.20x `packed` (`elmo embed`, fp32, a Zen 5, whose MKL runs
# its AVX2 code) and `fused` 0.67x `packed` on an AMX Xeon: which, only a measurement says.
MEASURED_MIN_WEIGHTS = 1 << 18
# The most rows a step of the CPU's ``rows`` layout may run, each measured: ``rows`` as a CUDA
# device runs it (up to 1,024) and half a default batch's sentences (two to a row).
CPU_ROW_COUNTS = (64, 1024)
# The sample the layouts are timed on: as many sentences as a batch of the engine's default budget
# holds (4,096 padded tokens, sentences of about 30), so each step runs the rows a job's steps run
# (the eager steps' passes over the gates slow down as they outgrow the caches: bf16 on an AMX
# Xeon, fused / packed 1.08x at 64 rows, 1.25x at 192, 1.77x at 576); 10-14 tokens each, which
# times the same steps in less time; the best of ``SAMPLE_TURNS`` in turns.
SAMPLE_SENTENCES, SAMPLE_LENGTHS, SAMPLE_TURNS = 128, (10, 14), 3
# The layouts' figures depend on this code as much as on the CPU (how a step splits its work, which
# products run where): part of the cache's key, raised with any change that moves them, so figures
# measured by another version of the code are measured again.
LAYOUTS_CODE = 6


@dataclass(frozen=True)
class Layout:
    """A layout that runs (never ``auto``) and why it was chosen."""

    name: str
    reason: str
    rows: int | None = None  # ``rows``: the most rows a step runs (``RowShape.rows``); None: ``RowShape()``'s
    onednn: bool = False  # ``packed``: every product on packed oneDNN weights (else by ``fast_lstm.packed_products``)

    def describe(self) -> str:
        """Its part of a run's line: ``fused layout: why``, with the rows or the products where set."""
        how = f" (at most {self.rows} rows a step)" if self.rows else \
            " (every product on packed oneDNN weights)" if self.onednn else ""
        return f"{self.name} layout{how}: {self.reason}"


def layout_record(layout: Layout | None) -> dict:
    """A run's layout as its record (``--json``, the manifests, ``/info``) keeps it, in flat keys."""
    if layout is None:
        return {"layout": None, "layout_reason": "", "layout_rows": None, "layout_onednn": False}
    return {"layout": layout.name, "layout_reason": layout.reason, "layout_rows": layout.rows,
            "layout_onednn": layout.onednn}


def check_layout(layout: str) -> str:
    """``layout`` checked: InputError for an unknown name."""
    if layout not in LAYOUTS:
        raise InputError(f"--layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def resolve_layout(layout: str | None, device: str, precision: str, config: ElmoConfig, threads: int,
                   measure: Callable[[ElmoConfig, str, int], tuple[dict[str, float], float]] | None = None,
                   tokens: int | None = None) -> Layout:
    """The layout that runs and why (``layout`` None or ``auto``: the module doc's rule); ``tokens``:
    a job's expected tokens, which a compiled layout's warm-up must repay (None: no end in sight)."""
    if layout not in (None, "auto"):
        return Layout(check_layout(layout), "asked for")
    if device.startswith("cuda"):
        return Layout("rows", "CUDA: static rows replayed as CUDA graphs")
    lstm = config.lstm
    if lstm.recurrent_weights < MEASURED_MIN_WEIGHTS:
        return Layout("packed", "small matrices: eager steps (nothing to measure)")
    key = f"{cpu_model()} | torch {torch.__version__} | layouts v{LAYOUTS_CODE} | {precision} | " \
          f"{lstm.n_layers}x{lstm.dim}/{lstm.projection_dim} | {threads} threads" \
          f"{', directions on threads of their own' if split(threads) else ''}"
    cache = cache_root() / "layouts.json"
    known = _read(cache).get(key)
    if not _complete(known, candidates(config)):
        print(f"measuring the recurrence's layouts ({', '.join(candidates(config))}) once for {key} ...",
              file=sys.stderr, flush=True)
        rates, warmup = (measure or measure_layouts)(config, precision, threads)
        known = {"tokens_per_s": rates, "warmup_s": warmup}
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache, {**_read(cache), key: known}, indent=1)
        except OSError as e:  # a read-only or full cache: the figures hold for this process only
            print(f"layouts: not kept in {cache} ({e.strerror or e})", file=sys.stderr, flush=True)
    return choose(known["tokens_per_s"], known["warmup_s"], tokens)


def _complete(known: object, names: list[str]) -> bool:
    """A cache entry with a figure for each of ``names`` and the warm-up: else measured again."""
    if not (isinstance(known, dict) and isinstance(known.get("tokens_per_s"), dict)
            and isinstance(known.get("warmup_s"), (int, float))):
        return False
    rates = known["tokens_per_s"]
    return set(rates) == set(names) and all(isinstance(v, (int, float)) for v in rates.values())


ONEDNN = "packed onednn"  # the measured name of ``packed`` with every product on packed oneDNN weights
EAGER = ("packed", ONEDNN)


def candidates(config: ElmoConfig) -> list[str]:
    """What a CPU measures: ``packed``, ``packed onednn`` where ``packed`` runs plain products for
    this shape, ``fused``, and ``rows N`` for each of ``CPU_ROW_COUNTS``."""
    onednn = [] if packed_products(config) else [ONEDNN]
    return ["packed", *onednn, "fused", *(f"rows {r}" for r in CPU_ROW_COUNTS)]


def choose(tokens_per_s: dict[str, float], warmup_s: float = 0.0, tokens: int | None = None) -> Layout:
    """The faster eager layout (``packed``, or on oneDNN products where it measured faster), unless a
    compiled one measured ``FUSED_MARGIN`` faster than it and, for a job of ``tokens``, saves more
    than its ``warmup_s`` over them, counting only its gain beyond the margin: a key ``rows N`` is
    the ``rows`` layout at most N rows a step."""
    figures = ", ".join(f"{name} {tps:,.0f}" for name, tps in tokens_per_s.items())
    figures = f"{figures} tokens/s of the recurrence, measured on this CPU"
    # the faster eager one; a tie keeps plain packed (listed first in EAGER: max takes the first)
    base = max((name for name in EAGER if name in tokens_per_s), key=lambda name: tokens_per_s[name], default="packed")
    eager, floor = Layout("packed", figures, onednn=base == ONEDNN), tokens_per_s.get(base, 0.0)
    best = max(tokens_per_s, key=lambda name: tokens_per_s[name], default="packed")
    if best in EAGER or not tokens_per_s[best] > 0 or tokens_per_s[best] < FUSED_MARGIN * floor:
        return eager
    name, _, rows = best.partition(" ")
    # what a token saves, trusted only beyond the margin (the sample's turns spread +-10 %): measured on the
    # recurrence alone, it ran above a whole job's saving (bf16 full size on an AMX Xeon, docs/performance.md)
    saved = 1 / floor - FUSED_MARGIN / tokens_per_s[best] if floor > 0 else math.inf
    repaid = warmup_s / saved if saved > 0 else math.inf if warmup_s > 0 else 0.0  # tokens that repay the warm-up
    if tokens is None:
        return Layout(name, figures, int(rows) if rows else None)
    after = f"after ~{repaid:,.0f} tokens" if math.isfinite(repaid) else "by no job (no gain beyond the margin)"
    weighed = f"{figures}; {best}'s warm-up (~{warmup_s:.0f} s a process) is repaid {after}, this job has ~{tokens:,}"
    return replace(eager, reason=weighed) if tokens < repaid else Layout(name, weighed, int(rows) if rows else None)


def _read(path) -> dict:  # type: ignore[no-untyped-def]
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or unreadable: measured again
    return found if isinstance(found, dict) else {}


def recurrence_sample(config: ElmoConfig, sentences: int, tokens: tuple[int, int]) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """What the recurrence is timed on: ``sentences`` random inputs of ``tokens`` (low, high) tokens
    each and both boundaries, seeded, with equal mixing weights; and the tokens they hold.

    Shape: -> x (B, T, P), lengths (B,), weights (L+1,), tokens.
    """
    gen = torch.Generator().manual_seed(0)
    low, high = tokens
    lengths = torch.randint(low + 2, high + 3, (sentences,), generator=gen)  # (B,) the tokens and the boundaries
    x = torch.randn(sentences, int(lengths.max()), config.lstm.projection_dim, generator=gen)  # (B, T, P)
    weights = torch.full((config.lstm.n_layers + 1,), 1.0 / (config.lstm.n_layers + 1))  # (L+1,)
    return x, lengths, weights, float((lengths - 2).sum())


def measure_layouts(config: ElmoConfig, precision: str, threads: int) -> tuple[dict[str, float], float]:
    """Tokens/s of the recurrence (every layer, both directions, mixed) under each of ``candidates``,
    in turns, best of ``SAMPLE_TURNS``; a layout that fails to build (no C++ compiler for the
    compiled kernels) measures 0. And a compiled layout's warm-up in seconds: the most a compiled
    one's first run took beyond its best (the first of them imports the compiler and compiles the
    kernels the others share: what a process running any one of them pays; with inductor's disk
    cache cold, more than a later process pays, which leans to the eager base)."""
    from elmo_core import BiLM
    from elmo_core.init import init_bilm

    from .fast_path import FastInference
    from .row_lstm import RowShape

    model = init_bilm(BiLM(config), seed=0).eval()
    x, lengths, weights, tokens = recurrence_sample(config, SAMPLE_SENTENCES, SAMPLE_LENGTHS)
    use_threads(threads)  # the run's own count, which its backend sets again when it opens
    runs, best, first = {}, {}, {}
    for name in candidates(config):
        layout, _, rows = name.partition(" ")
        onednn = {"packed_min_weights": 0} if name == ONEDNN else {}
        fast = FastInference(model, precision, layout=layout, capture=False,
                             rows=RowShape(int(rows) if rows.isdigit() else 1024), **onednn)
        try:
            first[name] = _seconds(fast, x, lengths, weights)  # packs the weights, compiles the kernels
        except (RuntimeError, OSError) as e:  # inductor without a C++ compiler, a failed build
            print(f"layout {name}: cannot run here ({str(e).splitlines()[0][:200]})", file=sys.stderr, flush=True)
            best[name] = 0.0
            continue
        runs[name] = fast
    for _ in range(SAMPLE_TURNS):
        for name, fast in runs.items():
            best[name] = max(best.get(name, 0.0), tokens / _seconds(fast, x, lengths, weights))
    warmup = max((first[name] - tokens / best[name] for name in runs if name not in EAGER), default=0.0)
    return best, max(warmup, 0.0)


def _seconds(fast, x: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    """Seconds ``fast`` takes to run the recurrence on the sample once."""
    t0 = time.perf_counter()
    with fast.running():
        fast.combine(x, lengths, weights)
    return time.perf_counter() - t0
