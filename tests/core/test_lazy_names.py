"""A package's names load their modules on first use (elmo_core.lazy_names), in a fresh interpreter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = """import json, sys
import inference
before = "inference.embedder" in sys.modules
Embedder = inference.Embedder
from inference.embedder import Embedder as home
try:
    inference.Nope
    missing = None
except AttributeError as e:
    missing = str(e)
print(json.dumps({"before": before, "same": Embedder is home, "kept": "Embedder" in vars(inference),
                  "missing": missing}))"""


def test_a_name_is_imported_from_its_module_on_first_use_and_kept():
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"before": False, "same": True, "kept": True,
                                    "missing": "module 'inference' has no attribute 'Nope'"}


def test_an_unknown_name_of_the_ground_floor_is_an_attribute_error():
    import elmo_core

    with pytest.raises(AttributeError, match="module 'elmo_core' has no attribute 'Nope'"):
        elmo_core.Nope  # noqa: B018
