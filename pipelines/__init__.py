"""`elmo embed`: Parquet (or text) corpora through the engine into Parquet or hdf5 vectors, exactly once, locally or on Ray.
May import: elmo_core, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
from __future__ import annotations

import importlib
from typing import Any

import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)

# Each name's module, imported on first use: importing the package loads no model code (the CLI's
# parsers and --help answer at once).
_HOMES = {
    "embed_parquet": "job", "ElmoLayersDataset": "layers_dataset", "collate_layers": "layers_dataset",
    "EmbedOptions": "options", "OutputDirError": "options", "ElmoPredictor": "predictor",
    "ELMO_COLUMN": "schema", "elmo_type": "schema"
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
