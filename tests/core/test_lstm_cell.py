"""The inference cell (``lstm_step_inplace``) against the reference ``lstm_step``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elmo_core.lstm_cell import lstm_step
from inference.fast_lstm import lstm_step_inplace, tanh_


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.05)])  # tight clips: both clamp some values
def test_inplace_step_equals_the_reference(clips):
    g = torch.Generator().manual_seed(0)
    D, N, C, P = 2, 5, 16, 4
    gates = torch.randn(D, N, 4 * C, generator=g, dtype=torch.float64) * 2  # (D, N, 4C)
    c_prev = torch.randn(D, N, C, generator=g, dtype=torch.float64)  # (D, N, C)
    w_proj = torch.randn(D, C, P, generator=g, dtype=torch.float64)  # (D, C, P)
    h_ref, c_ref = lstm_step(gates, c_prev, w_proj, *clips)
    state = c_prev.clone()
    h, c = lstm_step_inplace(gates.clone(), state, lambda m: torch.bmm(m, w_proj), *clips)
    assert c is state  # updated in the caller's buffer
    # float64 cell: reordered sums only
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
    if clips[0] is not None:
        assert c_ref.abs().max() == clips[0] and h_ref.abs().max() == clips[1]  # the clips were exercised


def test_the_inference_tanh_is_within_its_stated_error_in_place_and_into_strided_columns():
    """``fast_lstm.tanh_`` (numpy's SIMD tanh on a CPU): within 6e-8 of float64's tanh, as its
    docstring states (1 ulp near 1 is 6e-8; ATen's is within 3e-8, ``2 sigmoid(2x) - 1`` 1.8e-7);
    in place, or into columns of another tensor (the step writes tanh(c) over the used j gate)."""
    x = torch.linspace(-12, 12, 200_001)  # (n,) saturating at both ends, every rounding near 0
    exact = torch.tanh(x.double())
    got = tanh_(x.clone())
    assert (got.double() - exact).abs().max() <= 6.5e-8
    assert got[0] == -1 and got[-1] == 1 and tanh_(torch.tensor([float("nan")])).isnan().all()
    gates = torch.zeros(3, 4 * 5)  # (N, 4C)
    into = tanh_(x[:15].view(3, 5), out=gates[:, 5:10])  # (N, C) strided: j's columns
    assert into.data_ptr() == gates[:, 5:10].data_ptr() and gates[:, :5].eq(0).all() and gates[:, 10:].eq(0).all()
    torch.testing.assert_close(gates[:, 5:10].double(), exact[:15].view(3, 5), atol=6.5e-8, rtol=0)


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.05)])
def test_inplace_step_in_fp32_equals_the_float64_reference(clips):
    """fp32, the engine's type for the cell: its own tanh (``tanh_``) and fp32 rounding only."""
    g = torch.Generator().manual_seed(1)
    D, N, C, P = 2, 7, 64, 16
    gates = torch.randn(D, N, 4 * C, generator=g, dtype=torch.float64) * 3  # (D, N, 4C)
    c_prev = torch.randn(D, N, C, generator=g, dtype=torch.float64)  # (D, N, C)
    w_proj = torch.randn(D, C, P, generator=g, dtype=torch.float64) / 8  # (D, C, P)
    h_ref, c_ref = lstm_step(gates, c_prev, w_proj, *clips)
    h, c = lstm_step_inplace(gates.float(), c_prev.float(), lambda m: torch.bmm(m, w_proj.float()), *clips)
    # ~1e-7 a value from fp32 rounding and tanh_, summed over C = 64 terms of ~1/8 in the projection
    torch.testing.assert_close(c.double(), c_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(h.double(), h_ref, atol=2e-6, rtol=0)


def _numpy_baseline() -> list[str]:
    try:
        from numpy._core._multiarray_umath import __cpu_baseline__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_baseline__
    return list(__cpu_baseline__)


@pytest.mark.skipif(bool({"X86_V3", "AVX2", "FMA3"} & set(_numpy_baseline())),
                    reason="this numpy is built with AVX2 / FMA3 as its baseline: they cannot be turned off")
def test_the_inference_tanh_is_atens_where_numpy_has_no_simd_tanh():
    """numpy's plain tanh (no AVX2 / FMA3, as ``NPY_DISABLE_CPU_FEATURES`` makes it here) is 7x
    slower than ATen's and within 1.0e-7 only: ``tanh_`` then runs ATen's, bit for bit."""
    code = ("import torch; from inference.fast_lstm import numpy_simd_tanh, tanh_; "
            "x = torch.linspace(-12, 12, 100_001); "
            "print(numpy_simd_tanh(), torch.equal(tanh_(x.clone()), torch.tanh(x)))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "NPY_DISABLE_CPU_FEATURES": "X86_V4 X86_V3 AVX512_SKX AVX2 FMA3"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]
