"""Where one recurrent step's time goes on this CPU, per precision and row count: each part alone.

A step of the ``fused`` / ``rows`` layouts on a CPU (``inference.fused_lstm``) is four calls: the
recurrent product ``h W_h`` on packed oneDNN weights, the compiled ``cell`` kernel (gates, cell
state, ``m``; ``elmo_core.fused_cell``), the projection ``m W_P`` and the compiled ``store``. Each
is timed alone on one thread (as each direction runs, ``inference.directions``), best of
``--turns``, with the input part of the gates (``x W_in + b``, computed ``INPUT_CHUNK_ROWS`` rows
at a time) as its share a step. Prints milliseconds a step, each part's share, microseconds a row,
and each precision's step against fp32's at the same rows (the ratio a precision can reach end to
end if nothing else ran), then the cell kernel against its memory floor: the same kernel with its
five transcendentals taken out (``floor``: the bytes it moves, nothing else).

Full-size published widths by default (``--model``: another model directory's).

  python bench/bench_step.py [--precisions fp32,bf16] [--rows 104,256,1024] [--turns 5] [--model DIR]
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_bilm import FULL_SIZE, best_seconds  # noqa: E402
import torch  # noqa: E402
from elmo_core import ElmoConfig  # noqa: E402
from elmo_core.fused_cell import FusedCell, clip_tensor, compile_kernel  # noqa: E402
from elmo_core.kinds import Precision  # noqa: E402
from inference.fast_lstm import INPUT_CHUNK_ROWS  # noqa: E402
from inference.packed_gemm import PackedLinear  # noqa: E402
from inference.precision import cpu_flags  # noqa: E402


def best_ms(fn: Callable[[], object], turns: int, reps: int = 5) -> float:
    """Milliseconds a call of ``fn`` takes (``bench_bilm.best_seconds``)."""
    return best_seconds(fn, turns, reps) * 1e3


def floor_cell(gx: torch.Tensor, r: torch.Tensor, c: torch.Tensor, keep: None, cell_clip: torch.Tensor,
               m_dtype: torch.dtype) -> torch.Tensor:
    """``fused_cell.cell``'s reads and writes without its transcendentals: the kernel's memory floor.
    Shape: as ``cell``'s."""
    C = c.shape[-1]
    i, j, f, o = (gx.float() + r.float()).split(C, dim=-1)  # (1, n, C) each
    c_new = (f * c + i * j).clamp(-cell_clip, cell_clip)
    c.copy_(c_new)
    return (o * c_new).to(m_dtype)


def step_parts(precision: str, rows: int, config: ElmoConfig, turns: int) -> tuple[dict[str, float], float]:
    """Milliseconds of each part of one direction's step at ``rows`` rows, and of the cell kernel's
    memory floor (``floor_cell``) on the same tensors."""
    P, C = config.lstm.projection_dim, config.lstm.dim
    low, kernels = Precision.of(precision).torch, FusedCell.compiled()
    cell_clip, proj_clip = clip_tensor(config.lstm.cell_clip, "cpu"), clip_tensor(config.lstm.proj_clip, "cpu")
    w_s = PackedLinear((torch.randn(P, 4 * C) / P ** 0.5).to(low), rows)
    w_p = PackedLinear((torch.randn(C, P) / C ** 0.5).to(low), rows)
    w_in = PackedLinear((torch.randn(P, 4 * C) / P ** 0.5).to(low), INPUT_CHUNK_ROWS)
    h, x, bias = torch.randn(rows, P).to(low), torch.randn(INPUT_CHUNK_ROWS, P).to(low), torch.randn(4 * C)
    gx, r = torch.randn(1, rows, 4 * C).to(low), torch.randn(1, rows, 4 * C).to(low)  # (1, n, 4C)
    c, m = torch.zeros(1, rows, C), torch.randn(rows, C).to(low)  # (1, n, C), (n, C)
    h_raw, out, h_next = torch.randn(1, rows, P).to(low), torch.empty(1, rows, P), torch.empty(1, rows, P, dtype=low)
    parts = {
        "input part": best_ms(lambda: w_in(x, bias), turns) * rows / INPUT_CHUNK_ROWS,
        "recurrent product": best_ms(lambda: w_s(h), turns),
        "cell": best_ms(lambda: kernels.cell(gx, r, c, None, cell_clip, low), turns),
        "projection": best_ms(lambda: w_p(m), turns),
        "store": best_ms(lambda: kernels.store(h_raw, out, h_next, None, proj_clip), turns),
    }
    return parts, best_ms(lambda: compiled_floor()(gx, r, c, None, cell_clip, low), turns)


@functools.cache
def compiled_floor() -> Callable[..., torch.Tensor]:
    """``floor_cell`` compiled as the engine's kernels are (``compile_kernel``), once."""
    return compile_kernel(floor_cell)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rows", default="104,256,1024", help="rows a step (104: what 128-sentence batches average)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--model", type=Path, help="a model directory whose widths are timed (default: full size)")
    a = ap.parse_args()
    config = ElmoConfig.from_dict(json.loads((a.model / "options.json").read_text()) if a.model else FULL_SIZE)
    torch.set_num_threads(1)
    flags = sorted(f for f in cpu_flags() if f.startswith(("amx", "avx512_bf16", "avx512f")))
    print(f"one direction's step, P={config.lstm.projection_dim}, C={config.lstm.dim}, one thread; "
          f"CPU flags: {' '.join(flags)}")
    precisions = [p for p in a.precisions.split(",") if p]
    for rows in (int(n) for n in a.rows.split(",")):
        totals, cells = {}, {}
        for p in precisions:
            parts, floor = step_parts(p, rows, config, a.turns)
            totals[p], cells[p] = sum(parts.values()), (parts["cell"], floor)
            shares = ", ".join(f"{k} {v:.2f} ms ({v / totals[p]:.0%})" for k, v in parts.items())
            print(f"{p} {rows} rows: {totals[p]:.2f} ms a step = {totals[p] / rows * 1e3:.1f} us a row; {shares}")
        for p in precisions[1:]:
            print(f"{p} {rows} rows: {totals[precisions[0]] / totals[p]:.2f}x {precisions[0]}'s step")
        for p, (kernel, floor) in cells.items():
            print(f"{p} {rows} rows: cell kernel {kernel:.2f} ms, its memory floor {floor:.2f} ms ({kernel / floor:.1f}x)")


if __name__ == "__main__":
    main()
