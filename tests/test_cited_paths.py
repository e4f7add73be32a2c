"""Every test or benchmark file the code and the docs name exists (a docstring that says
"see tests/inference/test_x.py" must point at a real file). Read: the library's packages, the
benchmarks, the tests themselves, the scripts, the Makefile, the README and docs/*.md. A path
(``tests/core/test_bilm.py``) must be that file; a bare name (``test_bilm.py``, ``bench_host.py``)
must be some file's name under tests/ or bench/. The history of figures
(docs/performance-history.md) names files as they were, so it is left out."""
from __future__ import annotations

import re
from pathlib import Path

from tests.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\b((?:tests|bench)/[A-Za-z0-9_/.-]*?\.py)\b")
BARE = re.compile(r"(?<![\w/.-])((?:test|bench)_\w+\.py)\b")  # a file's name without its folder
HISTORY = {"docs/performance-history.md"}
THIS = Path(__file__).resolve()  # its examples name files that do not exist


def cited_paths(text: str) -> set[str]:
    return set(CITED.findall(text))


def bare_names(text: str) -> set[str]:
    return set(BARE.findall(text))


def citing_files() -> list[Path]:
    code = [p for folder in (*LAYERS, "bench", "tests", "scripts") for p in (ROOT / folder).rglob("*.py")]
    docs = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md")]
    return [p for p in code + docs if str(p.relative_to(ROOT)) not in HISTORY and p.resolve() != THIS]


def test_the_patterns_find_a_cited_path_and_a_bare_name() -> None:
    text = "see tests/inference/test_row_lstm.py, `bench/bench_host.py` and test_fused_lstm.py (bench_gpu.py)."
    assert cited_paths(text) == {"tests/inference/test_row_lstm.py", "bench/bench_host.py"}
    assert bare_names(text) == {"test_fused_lstm.py", "bench_gpu.py"}


def test_every_cited_test_or_bench_file_exists() -> None:
    files = citing_files()
    assert len(files) > 300  # the library's modules, the benchmarks, the tests and the docs were found
    known = {p.name for folder in ("tests", "bench") for p in (ROOT / folder).rglob("*.py")}
    missing = []
    for p in files:
        text = p.read_text(encoding="utf-8")
        missing += [f"{p.relative_to(ROOT)}: {cited}" for cited in cited_paths(text) if not (ROOT / cited).is_file()]
        missing += [f"{p.relative_to(ROOT)}: {name} (no such file under tests/ or bench/)"
                    for name in bare_names(text) if name not in known]
    assert not missing, missing
