"""A package's names imported from their modules on first use (PEP 562's module ``__getattr__``), so
importing the package loads no model code: the CLI's parsers and ``--help`` answer at once.
Standard library only."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``name`` from its module ``homes[name]`` (relative to
    ``package``), kept in ``namespace`` (the package's globals) once imported."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", package), name)
        namespace[name] = value
        return value
    return __getattr__
