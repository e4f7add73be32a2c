"""Every test or benchmark file the library's code and the docs name exists (a docstring that says
"see tests/inference/test_x.py" must point at a real file). The history of figures
(docs/performance-history.md) names files as they were, so it is left out."""
from __future__ import annotations

import re
from pathlib import Path

from tests.test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"\b((?:tests|bench)/[A-Za-z0-9_/.-]*?\.py)\b")
HISTORY = {"docs/performance-history.md"}


def cited_paths(text: str) -> set[str]:
    return set(CITED.findall(text))


def citing_files() -> list[Path]:
    library = [p for package in LAYERS for p in (ROOT / package).rglob("*.py")]
    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    return [p for p in library + docs if str(p.relative_to(ROOT)) not in HISTORY]


def test_the_pattern_finds_a_cited_path() -> None:
    assert cited_paths("see tests/inference/test_row_lstm.py and `bench/bench_host.py`.") == {
        "tests/inference/test_row_lstm.py", "bench/bench_host.py"}


def test_every_cited_test_or_bench_file_exists() -> None:
    files = citing_files()
    assert len(files) > 100  # the library's modules and the docs were found
    missing = sorted(f"{p.relative_to(ROOT)}: {cited}" for p in files
                     for cited in cited_paths(p.read_text(encoding="utf-8")) if not (ROOT / cited).is_file())
    assert not missing, missing
