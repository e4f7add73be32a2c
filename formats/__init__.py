"""The files the project reads and writes: model directories (model_dir.py), the published hdf5 weights, ELMoForManyLangs, token-embedding files, the export spec and manifest.
May import: elmo_core (tests/test_layers.py)."""
from __future__ import annotations

import importlib
from typing import Any

import elmo_core.process_env  # noqa: F401 (first: the environment torch reads when it loads)

# Each name's module, imported on first use: importing the package loads no model code (the CLI's
# parsers and --help answer at once).
_HOMES = {
    "ModelFiles": "model_dir", "load_bilm": "model_dir", "resolve_model": "model_dir",
    "save_model": "model_dir"
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
