"""The GPU proxy's counts (``bench/gpu_proxy.py``, ``python bench/bench_gpu.py --proxy``) as tests:
a count cannot flake, and a change that breaks one fails here. A recurrent step of the rows path
with the kernels compiled as CUDA compiles them: at most 4 kernels (two products, two fused
kernels) and one pass over the gate tensor; the eager step before it, for contrast, more of both.
Counted in a fresh interpreter, as the proxy runs: the profiler sees inductor's kernels only where
they were generated with ``cpp.enable_kernel_profile`` on, which a process that compiled the
kernels before cannot promise."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"lstm": {"use_skip_connections": True, "projection_dim": 16, "cell_clip": 3, "proj_clip": 3, "dim": 32,
                  "n_layers": 2},
         "char_cnn": {"activation": "relu", "filters": [[1, 4], [2, 4]], "n_highway": 1, "embedding": {"dim": 4},
                      "n_characters": 262, "max_characters_per_token": 50}}
COUNT = """
import json, sys
import torch
import torch._inductor.config as inductor_config
from elmo_core.fused_cell import FusedCell
from inference.fast_lstm import FastLstm
from inference.fused_lstm import FusedLstm
from gpu_proxy import eager_step_costs, full_size_stack, row_step_costs
inductor_config.cpp.enable_kernel_profile = True
model = full_size_stack(json.loads(sys.argv[1]))
torch.set_num_threads(2)  # a CPU's directions split on an even count: the counts must hold there too
with torch.inference_mode():
    fused = row_step_costs(FusedLstm(model.lstm, kernels=FusedCell.compile(), directions=False), rows=8)
    eager = eager_step_costs(FastLstm(model.lstm, packed_min_weights=1 << 62, directions=False), rows=8)
    try:
        eager_step_costs(FastLstm(model.lstm, packed_min_weights=1 << 62), rows=8)
        raise SystemExit("a step whose directions split was counted")
    except ValueError:
        pass
print(json.dumps({"fused": fused, "eager": eager}))
"""


def test_a_fused_row_step_is_four_kernels_and_one_pass_over_the_gates():
    env_path = f"{ROOT}:{ROOT / 'bench'}"
    r = subprocess.run([sys.executable, "-c", COUNT, json.dumps(SMALL)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": env_path})
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    (kernels, passes), (eager_kernels, eager_passes) = counts["fused"], counts["eager"]
    assert kernels <= 4 and passes == 1, counts
    assert eager_kernels > kernels and eager_passes > passes, counts


def test_padding_at_the_cuda_defaults_is_the_engines_own(tmp_path):
    """The proxy's padded fraction is that of ``elmo embed``'s own planner (sort windows, batches
    planned for the static rows) at the budget a run settles on an 80 GB card, laid in the rows of
    the CUDA path as ``RowGraphs`` lays them. At a CPU's budget, the default on CUDA before runs
    were sized to their device, about a third of the positions held no token. The issue's target
    is 0.05; measured 0.026 (docs/gpu.md), where length-sorted rectangles dealt into the rows left
    0.107."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_proxy import cuda_defaults, padded_fractions
    from corpora.sample import write_sample_corpus
    from inference.batching import cpu_batch_budget

    write_sample_corpus(tmp_path, rows=20_000, files=1, row_group_rows=5000)
    after = cuda_defaults({"lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2}})
    assert after.tokens == 131072 and after.window_tokens == 8 * 131072
    pads = padded_fractions(tmp_path, cpu_batch_budget(), after, step_rows=128)
    assert pads["before"]["padded"] > 0.3, pads
    assert pads["after"]["padded"] <= 0.05, pads
    assert pads["after"]["steps_per_1M"] < pads["before"]["steps_per_1M"] / 8, pads
    assert pads["after"]["grid_per_token"] <= 1.8 and len(pads["after"]["row_counts"]) <= 3, pads
