"""Results as people read them (``--json`` prints them as they are): counts with their nouns in the
right number, numbers rounded, one labelled line per field, no JSON or Python repr."""
from __future__ import annotations

from typing import Any, Iterator

LABEL_WIDTH = 18


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 row``, ``0 rows``, ``2,000 rows``."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def value_text(value: Any) -> str:
    """A value on one line: floats to 4 significant digits, ints with separators, a mapping as
    ``key value, ...``, a sequence comma-separated, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {value_text(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value) or "-"
    return str(value)


def labelled_lines(record: dict[str, Any], indent: str = "") -> Iterator[str]:
    """One ``label  value`` line per field; a nested mapping of mappings as its own indented block."""
    for key, value in record.items():
        label = key.replace("_", " ")
        if isinstance(value, dict) and any(isinstance(v, dict) for v in value.values()):
            yield f"{indent}{label}:"
            yield from labelled_lines(value, indent + "  ")
        else:
            yield f"{indent}{label:<{LABEL_WIDTH - len(indent)}} {value_text(value)}"
