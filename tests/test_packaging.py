"""The project installs without warnings from its own pyproject.toml (issue #56, F10: setuptools
warned four times that ``project.license`` as a table is deprecated)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_building_the_package_warns_of_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                        str(ROOT)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning" not in (r.stdout + r.stderr).lower(), (r.stdout + r.stderr)[-3000:]
    assert len(list(tmp_path.glob("elmo_pipeline-*.whl"))) == 1
