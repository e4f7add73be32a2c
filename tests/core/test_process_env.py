"""Every door gets the same process environment (OpenMP's wait policy, oneDNN's cache caps, torch's huge pages) before
torch loads, whatever package a user imports first: ``elmo_core``'s import sets it
(``elmo_core/process_env.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_core.process_env import (CACHE_VARIABLES, HUGE_PAGE_VARIABLE, PRIMITIVE_CACHE_CAPACITY, WAIT_VARIABLES,
                                   settle)

ROOT = Path(__file__).resolve().parents[2]
SET = WAIT_VARIABLES + CACHE_VARIABLES + (HUGE_PAGE_VARIABLE,)
CHOSEN = {**dict.fromkeys(CACHE_VARIABLES, PRIMITIVE_CACHE_CAPACITY), HUGE_PAGE_VARIABLE: "1"}  # beside the wait policy
DOORS = ("pipelines", "inference", "training", "serving", "elmo_core", "formats", "export", "runtime", "corpora")
CODE = """import json, os, sys
import {0}
import torch
mods = list(sys.modules)
print(json.dumps({{"env": {{k: os.environ.get(k) for k in {1!r}}},
                  "settled_before_torch": mods.index("elmo_core.process_env") < mods.index("torch")}}))"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SET}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _after_import(module: str, **extra: str) -> dict:
    code = CODE.format(module, SET)
    r = subprocess.run([sys.executable, "-c", code], env=_clean_env(**extra), cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_settle_keeps_what_the_user_chose():
    env: dict[str, str] = {}
    settle(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", **CHOSEN}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}, {"KMP_BLOCKTIME": "0"},
                   {"OMP_WAIT_POLICY": "PASSIVE", HUGE_PAGE_VARIABLE: "0"}):
        kept = dict(chosen)
        settle(kept)
        assert kept == {**CHOSEN, **chosen}


@pytest.mark.parametrize("module", DOORS)
def test_any_door_first_gives_the_same_environment_before_torch(module):
    got = _after_import(module)
    assert got == {"env": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None, **CHOSEN},
                   "settled_before_torch": True}


def test_a_users_policy_is_kept():
    got = _after_import("pipelines", OMP_WAIT_POLICY="ACTIVE", LRU_CACHE_CAPACITY="512", THP_MEM_ALLOC_ENABLE="0")
    assert got["env"]["OMP_WAIT_POLICY"] == "ACTIVE" and got["env"]["LRU_CACHE_CAPACITY"] == "512"
    assert got["env"][HUGE_PAGE_VARIABLE] == "0"
