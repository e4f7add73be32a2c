"""Importing ``inference`` (which imports ``runtime``) caps oneDNN's primitive caches before any
model runs (bounded memory in long jobs), unless the user set them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from elmo_core.process_env import PRIMITIVE_CACHE_CAPACITY

CODE = ("import json, os, inference; print(json.dumps({k: os.environ.get(k) for k in "
        "('ONEDNN_PRIMITIVE_CACHE_CAPACITY', 'LRU_CACHE_CAPACITY')}))")


def _env_after_import(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", CODE], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_import_caps_the_caches():
    assert _env_after_import() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": PRIMITIVE_CACHE_CAPACITY,
                                   "LRU_CACHE_CAPACITY": PRIMITIVE_CACHE_CAPACITY}


def test_a_users_setting_is_kept():
    got = _env_after_import(LRU_CACHE_CAPACITY="512")
    assert got == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": PRIMITIVE_CACHE_CAPACITY, "LRU_CACHE_CAPACITY": "512"}


PACKAGES = ("elmo_core", "runtime", "corpora", "formats", "inference", "export", "training", "pipelines", "serving",
            "elmo_cli")


def test_whatever_package_is_imported_first_the_environment_is_settled_before_torch_loads():
    """The library gets the CLI's settings whatever a user imports first: each package imports
    elmo_core first, which settles the environment and loads nothing else (torch not yet)."""
    code = ("import importlib, json, os, sys; before = 'torch' in sys.modules; import elmo_core; "
            "torch_then = 'torch' in sys.modules; importlib.import_module(sys.argv[1]); "
            "print(json.dumps([before, torch_then, os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY')]))")
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    for package in PACKAGES:
        out = subprocess.run([sys.executable, "-c", code, package], env=base, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == [False, False, "PASSIVE", PRIMITIVE_CACHE_CAPACITY], (package, out.stdout)


def test_flushing_denormals_holds_in_the_block_only():
    import torch

    from runtime import flushing_denormals

    def flushed() -> bool:
        return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0

    assert not flushed()
    with flushing_denormals():
        assert flushed()
    assert not flushed()  # a caller's maths keeps its denormals (hypothesis refuses to run without them)
