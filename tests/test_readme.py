"""Every ```python snippet of README.md runs as written, in a fresh interpreter, in a directory
holding the files the snippets name (a tiny model's options.json and weights.hdf5), with a real
``elmo serve`` where a snippet calls one (its address put where the snippet has 127.0.0.1:8080).

A snippet that cannot run here is marked in README.md by an HTML comment on the line before it,
``<!-- not run: REASON -->``; none is today."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY_OPTIONS, make_model_dir
from tests.serving.server_utils import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)
README_ADDRESS = "http://127.0.0.1:8080"


def snippets() -> list[tuple[str, str | None]]:
    """(code, why not run or None) of each ```python block of README.md, in order."""
    return [(m["code"], m["why"]) for m in SNIPPET.finditer((ROOT / "README.md").read_text(encoding="utf-8"))]


def test_the_readme_has_python_snippets_and_none_is_skipped():
    found = snippets()
    assert len(found) >= 3
    assert [why for _, why in found if why] == []


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_model_dir(tmp_path_factory.mktemp("served") / "tiny", TINY_OPTIONS)
    s = ServerProcess(model, "--quiet")
    try:
        yield s.url
    finally:
        s.stop()


@pytest.mark.parametrize("index", range(len(snippets())))
def test_readme_snippet_runs(index, tmp_path, request):
    code, why = snippets()[index]
    if why:
        pytest.skip(f"README.md marks it not run: {why}")
    make_model_dir(tmp_path / "model", TINY_OPTIONS)
    for name in ("options.json", "weights.hdf5"):
        os.link(tmp_path / "model" / name, tmp_path / name)
    if README_ADDRESS in code:
        code = code.replace(README_ADDRESS, request.getfixturevalue("server"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"README snippet {index + 1}:\n{code}\n{r.stderr[-3000:]}"
