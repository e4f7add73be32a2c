"""Importing ``inference`` (which imports ``runtime``) caps oneDNN's primitive caches before any
model runs (bounded memory in long jobs), unless the user set them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
