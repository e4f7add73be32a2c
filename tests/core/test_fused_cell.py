"""The fused element-wise kernels of a step (``elmo_core.fused_cell``), compiled (inductor's CPU
backend) and eager, against the reference cell ``lstm_step``, and each compiled into one kernel."""
from __future__ import annotations

import pytest
import torch

from elmo_core.fused_cell import FusedCell, clip_tensor
from elmo_core.lstm_cell import lstm_step

D, N, C, P = 2, 11, 24, 8


def _inputs(seed: int, n: int = N):
    g = torch.Generator().manual_seed(seed)
    gx, r = (torch.randn(D, n, 4 * C, generator=g) * 2 for _ in range(2))
    c = torch.randn(D, n, C, generator=g) * 3
    w_proj = torch.randn(D, C, P, generator=g)
    return gx, r, c, w_proj


def _step_with(kernels: FusedCell, gx, r, c, keep, w_proj, cell_clip, proj_clip, low=torch.float32):
    """One inference step through ``cell`` and ``store``; returns (out, h_next, c)."""
    c = c.clone()
    out, h_next = torch.empty(D, gx.shape[1], P), torch.empty(D, gx.shape[1], P, dtype=low)
    m = kernels.cell(gx, r, c, keep, clip_tensor(cell_clip, "cpu"), low)
    kernels.store(torch.bmm(m, w_proj.to(low)), out, h_next, keep, clip_tensor(proj_clip, "cpu"))
    return out, h_next, c


@pytest.mark.parametrize("kind", ["compiled", "eager"])
@pytest.mark.parametrize("clips", [(3.0, 2.0), (None, None)])
def test_cell_and_store_are_the_reference_step(kind, clips):
    kernels = FusedCell.compiled() if kind == "compiled" else FusedCell.eager()
    gx, r, c, w_proj = _inputs(0)
    keep = torch.rand(1, N, 1, generator=torch.Generator().manual_seed(1)) > 0.4
    keep[0, 0, 0] = False
    for mask in (None, keep):
        out, h_next, c_new = _step_with(kernels, gx, r, c, mask, w_proj, *clips)
        c_prev = c if mask is None else torch.where(mask, c, 0.0)
        want_h, want_c = lstm_step(gx + r, c_prev, w_proj, *clips)  # (D, N, P), (D, N, C)
        # the same sums in the same order; only sigmoid / tanh may differ by an ulp (vectorized)
        torch.testing.assert_close(out, want_h, rtol=0, atol=1e-6 * float(want_h.abs().max()))
        torch.testing.assert_close(c_new, want_c, rtol=0, atol=1e-6 * float(want_c.abs().max()))
        assert torch.equal(h_next, out if mask is None else torch.where(mask, out, 0.0))
    if clips[0] is not None:
        assert float(c_new.abs().max()) == clips[0] and float(out.abs().max()) == clips[1]  # both clips bite


def test_bf16_products_keep_the_cell_in_fp32():
    gx, r, c, w_proj = _inputs(2)
    out, h_next, c_new = _step_with(FusedCell.compiled(), gx, r, c, None, w_proj, 3.0, 2.0, torch.bfloat16)
    want_h, want_c = lstm_step(gx + r, c, w_proj, 3.0, 2.0)
    assert h_next.dtype == torch.bfloat16 and out.dtype == torch.float32 and c_new.dtype == torch.float32
    torch.testing.assert_close(c_new, want_c, rtol=0, atol=1e-6 * 3)  # the cell never saw bf16
    cos = torch.nn.functional.cosine_similarity(out, want_h, dim=-1)
    assert float(cos.min()) >= 0.999


def _profiled_kernels(fn, *args) -> list[str]:
    """The kernels inductor generates for ``fn`` (a function of elmo_core.fused_cell), compiled
    apart from the shared ``FusedCell.compiled()`` with kernel profiling on: the profiler's names
    for the kernels one call runs."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, inputs):
        with inductor_config.patch({"cpp.enable_kernel_profile": True}):
            return compile_fx(gm, inputs)
    compiled = torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    compiled(*args)
    with torch.profiler.profile() as prof:
        compiled(*args)
    return [e.name for e in prof.events() if "cpp_fused" in e.name or "triton_" in e.name]


def test_each_kernel_compiles_to_one_fused_loop():
    """The point of the module: each function is one kernel, so one pass over the gate tensor."""
    from elmo_core import fused_cell

    gx, r, c, _ = _inputs(3)
    clip = clip_tensor(3.0, "cpu")
    saved = [torch.empty(D, N, C) for _ in range(3)] + [torch.empty(D, N, 3 * C), torch.empty(D, N, C),
                                                        torch.empty(D, N, C, dtype=torch.bool)]
    h = torch.randn(D, N, P)
    calls = {
        "cell": (gx, r, c.clone(), torch.ones(1, N, 1, dtype=torch.bool), clip, torch.bfloat16),
        "store": (h, torch.empty(D, N, P), torch.empty(D, N, P), None, clip),
        "train_forward": (gx, r, c.clone(), clip, tuple(saved), torch.float32),
        "train_store": (h, torch.empty(D, N, P), torch.empty(D, N, P), torch.empty(D, N, P, dtype=torch.bool), clip),
        "train_backward_h": (h, h, torch.ones(D, N, P, dtype=torch.bool), torch.empty(D, N, P), torch.bfloat16),
        "train_backward_cell": (torch.randn(D, N, C), torch.randn(D, N, C), tuple(saved), torch.empty(D, N, 4 * C),
                                torch.float32),
    }
    counts = {name: len(_profiled_kernels(getattr(fused_cell, name), *args)) for name, args in calls.items()}
    assert counts == dict.fromkeys(calls, 1)


def test_kernels_are_built_by_name_and_leave_the_process_dynamo_settings_alone():
    """Each field holds the function of its name; compiling a set (and running it) changes no
    process-wide dynamo setting: the recompile limit is the compile calls' own."""
    import torch._dynamo.config as dynamo_config

    from elmo_core import fused_cell

    eager = FusedCell.eager()
    assert {name: getattr(eager, name) for name in fused_cell.KERNELS} == fused_cell.KERNELS
    fresh = FusedCell.compile()
    gx, r, c, w_proj = _inputs(5)
    got, want = _step_with(fresh, gx, r, c, None, w_proj, 3.0, 2.0), _step_with(eager, gx, r, c, None, w_proj, 3.0, 2.0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for name in ("recompile_limit", "accumulated_recompile_limit"):  # an older torch's: the next test
        assert not fused_cell._TAKES_OWN_LIMIT or getattr(dynamo_config, name) == dynamo_config._config[name].default, name


def test_a_torch_without_a_limit_of_the_compile_calls_own_compiles_under_the_process_limit(monkeypatch):
    """An older torch's ``torch.compile`` (2.11, the lent GPU machines' image) takes neither
    ``recompile_limit`` nor ``isolate_recompiles``: the kernels compile without them, and the
    process's limit is raised to ours (with ``fullgraph``, dynamo's default 8 fails a test session's
    ninth variant); where it was higher it is left."""
    import torch._dynamo.config as dynamo_config

    from elmo_core import fused_cell

    seen = {}
    monkeypatch.setattr(fused_cell, "_TAKES_OWN_LIMIT", False)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
    with dynamo_config.patch(recompile_limit=8):  # torch's own patch: monkeypatch's undo would hide the setting
        assert fused_cell.compile_kernel(fused_cell.cell) is fused_cell.cell
        assert "recompile_limit" not in seen and "isolate_recompiles" not in seen and seen["fullgraph"] is True
        assert dynamo_config.recompile_limit == fused_cell.RECOMPILE_LIMIT
    with dynamo_config.patch(recompile_limit=1000):
        fused_cell.compile_kernel(fused_cell.cell)
        assert dynamo_config.recompile_limit == 1000
    assert dynamo_config.recompile_limit == dynamo_config._config["recompile_limit"].default
    monkeypatch.setattr(fused_cell, "_TAKES_OWN_LIMIT", True)
    fused_cell.compile_kernel(fused_cell.cell)
    assert seen["recompile_limit"] == fused_cell.RECOMPILE_LIMIT and seen["isolate_recompiles"] is True
