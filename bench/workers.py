"""A benchmark's worker processes: each variant timed in a fresh interpreter, its figures the last line
it prints (JSON)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_worker(cmd: list[str], name: str) -> dict:
    """``cmd`` run from the repository root; its last line of output as JSON. SystemExit naming
    ``name`` with the end of its stderr where it failed."""
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{name}: worker failed\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
