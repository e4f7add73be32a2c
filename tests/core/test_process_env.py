"""Every door gets the same process environment (OpenMP's wait policy, oneDNN's cache caps, a heap that keeps freed
memory, else torch's huge pages) before torch loads, whatever module of the project a user imports first: each
package's ``__init__`` settles it (``elmo_core/process_env.py``); torch imported before the project is said, not
silently run spinning."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import platform

import pytest

from elmo_core.process_env import (CACHE_VARIABLES, HUGE_PAGE_VARIABLE, PRIMITIVE_CACHE_CAPACITY, WAIT_VARIABLES,
                                   settle)

ROOT = Path(__file__).resolve().parents[2]
SET = WAIT_VARIABLES + CACHE_VARIABLES + (HUGE_PAGE_VARIABLE,)
CHOSEN = {**dict.fromkeys(CACHE_VARIABLES, PRIMITIVE_CACHE_CAPACITY), HUGE_PAGE_VARIABLE: "1"}  # beside the wait policy
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
# a process's own: where its heap keeps freed memory (glibc), torch's huge pages are not asked for
PROCESS_CHOSEN = {**CHOSEN, HUGE_PAGE_VARIABLE: None if GLIBC else "1"}
DOORS = ("import pipelines, torch", "from inference.embedder import Embedder; import torch", "import training, torch",
         "import serving, torch", "import elmo_core, torch", "import formats, torch", "import export, torch",
         "import runtime, torch", "import corpora, torch", "import elmo_cli.main, torch")
TORCH_FIRST = "import torch, pipelines"
# OpenMP prints what it read when torch loaded it (OMP_DISPLAY_ENV): GOMP_SPINCOUNT 0 waits passively.
CODE = """import json, os, sys
{0}
mods = list(sys.modules)
torch.ones(64, 64).sum()
print(json.dumps({{"env": {{k: os.environ.get(k) for k in {1!r}}},
                  "settled_before_torch": mods.index("elmo_core.process_env") < mods.index("torch")}}))"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SET and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _after_import(order: str, **extra: str) -> dict:
    """The environment left for child processes, whether it was settled before torch loaded, what
    OpenMP read (GOMP_SPINCOUNT) and what the process said (warnings)."""
    r = subprocess.run([sys.executable, "-c", CODE.format(order, SET)], env=_clean_env(OMP_DISPLAY_ENV="VERBOSE", **extra),
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    spin = [line.split("=")[1].strip(" '") for line in r.stderr.splitlines() if line.strip().startswith("GOMP_SPINCOUNT")]
    return {**json.loads(r.stdout), "openmp_spin": spin[0], "said": [ln for ln in r.stderr.splitlines() if "Warning" in ln]}


def test_settle_keeps_what_the_user_chose():
    env: dict[str, str] = {}
    settle(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", **CHOSEN}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}, {"KMP_BLOCKTIME": "0"},
                   {"OMP_WAIT_POLICY": "PASSIVE", HUGE_PAGE_VARIABLE: "0"}):
        kept = dict(chosen)
        settle(kept)
        assert kept == {**CHOSEN, **chosen}


@pytest.mark.parametrize("order", DOORS)
def test_any_module_of_the_project_first_gives_the_same_environment_before_torch(order):
    got = _after_import(order)
    assert got == {"env": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None, "KMP_BLOCKTIME": None, **PROCESS_CHOSEN},
                   "settled_before_torch": True, "openmp_spin": "0", "said": []}


def test_torch_imported_before_the_project_is_said_and_a_users_policy_holds_in_either_order():
    got = _after_import(TORCH_FIRST)
    assert got["env"]["OMP_WAIT_POLICY"] == "PASSIVE" and got["openmp_spin"] != "0"  # OpenMP read it before: it spins
    assert len(got["said"]) == 1 and "RuntimeWarning: torch was imported before the elmo library" in got["said"][0]
    assert "OMP_WAIT_POLICY=PASSIVE" in got["said"][0]
    chosen = _after_import(TORCH_FIRST, OMP_WAIT_POLICY="PASSIVE")
    assert (chosen["openmp_spin"], chosen["said"]) == ("0", [])


def test_a_users_policy_is_kept():
    got = _after_import(DOORS[0], OMP_WAIT_POLICY="ACTIVE", LRU_CACHE_CAPACITY="512", THP_MEM_ALLOC_ENABLE="0")
    assert got["env"]["OMP_WAIT_POLICY"] == "ACTIVE" and got["env"]["LRU_CACHE_CAPACITY"] == "512"
    assert got["env"][HUGE_PAGE_VARIABLE] == "0" and got["said"] == []


# A worker thread's tensors of a few sizes, allocated and freed twice over: the page faults of the second round
FAULTS = """import resource, threading
import elmo_core, torch
from elmo_core.process_env import settle

def work(out):
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for i in range(20):
            y = torch.empty(4096 + 64 * (i % 3), 512).fill_(1.0)  # ~8 MiB, three sizes
            z = torch.cat([y, y])
            del y, z
        out.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

got = []
t = threading.Thread(target=work, args=(got,))
t.start()
t.join()
print(settle().heap_reused, got[1])"""


def _faults(**extra: str) -> tuple[bool, int]:
    r = subprocess.run([sys.executable, "-c", FAULTS], env=_clean_env(**extra), cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    reused, faults = r.stdout.split()
    return reused == "True", int(faults)


@pytest.mark.skipif(not GLIBC, reason="mallopt's options are glibc's; other C libraries keep their own heap policy")
def test_a_batch_reuses_the_memory_the_previous_one_freed():
    """Each batch's tensors come back from the heap, not from fresh pages the kernel faults and zeroes
    (a count: 0 of the ~60,000 4 KiB pages the second round's 60 tensors span, with glibc's defaults
    ~27,000 here, or ~2,000 huge-page faults with torch's huge pages)."""
    reused, faults = _faults()
    assert reused and faults <= 64, faults


@pytest.mark.skipif(not GLIBC, reason="mallopt's options are glibc's")
def test_a_users_malloc_settings_are_kept():
    for chosen in ({"MALLOC_ARENA_MAX": "4"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"}):
        assert not _faults(**chosen)[0]
        assert _after_import(DOORS[0], **chosen)["env"][HUGE_PAGE_VARIABLE] == "1"  # torch's huge pages instead


def test_settle_is_idempotent_and_records_the_first_call():
    first = settle()
    assert settle() is first and not first.torch_loaded_first  # tests/conftest.py settles before torch loads


PACKAGES = {p.parent.name for p in ROOT.glob("*/__init__.py") if "settle()" in p.read_text()}


def _first_loader(path: Path) -> str | None:
    """The first of torch, a settling package of the project or another benchmark that ``path`` imports at
    its top level (a benchmark imported first counts as its own first)."""
    import ast

    for node in ast.parse(path.read_text()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            parts = name.split(".")
            top = parts[1] if parts[0] == "bench" and len(parts) > 1 else parts[0]  # bench.bench_x as bench_x
            if top == "torch" or top in PACKAGES:
                return top
            if (ROOT / "bench" / f"{top}.py").exists():
                return _first_loader(ROOT / "bench" / f"{top}.py")
    return None


@pytest.mark.parametrize("bench", sorted(p.name for p in (ROOT / "bench").glob("bench_*.py")))
def test_a_benchmark_measures_the_environment_users_get(bench):
    """A benchmark that loaded torch before the project would time OpenMP's spinning threads, which no
    command or library caller runs (a quiet machine's figures above theirs, a busy one's far below)."""
    assert _first_loader(ROOT / "bench" / bench) != "torch"
