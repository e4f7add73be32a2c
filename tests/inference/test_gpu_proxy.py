"""The GPU proxy's counts (``bench/gpu_proxy.py``, ``python bench/bench_gpu.py --proxy``) as tests:
a count cannot flake, and a change that breaks one fails here. A recurrent step of the rows path
with the kernels compiled as CUDA compiles them: at most 4 kernels (two products, two fused
kernels) and one pass over the gate tensor; the eager step before it, for contrast, more of both."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from elmo_core.fused_cell import FusedCell
from inference.fast_lstm import FastLstm
from inference.fused_lstm import FusedLstm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from gpu_proxy import eager_step_costs, full_size_stack, row_step_costs  # noqa: E402

SMALL = {"lstm": {"use_skip_connections": True, "projection_dim": 16, "cell_clip": 3, "proj_clip": 3, "dim": 32,
                  "n_layers": 2},
         "char_cnn": {"activation": "relu", "filters": [[1, 4], [2, 4]], "n_highway": 1, "embedding": {"dim": 4},
                      "n_characters": 262, "max_characters_per_token": 50}}


def test_a_fused_row_step_is_four_kernels_and_one_pass_over_the_gates():
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True
    model = full_size_stack(SMALL)
    with torch.inference_mode():
        kernels, passes = row_step_costs(FusedLstm(model.lstm, kernels=FusedCell.compile()), rows=8)
        eager_kernels, eager_passes = eager_step_costs(FastLstm(model.lstm, packed_min_weights=1 << 62), rows=8)
    assert kernels <= 4 and passes == 1, (kernels, passes)
    assert eager_kernels > kernels and eager_passes > passes
