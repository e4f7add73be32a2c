"""The files the project reads and writes: model directories (model_dir.py), the published hdf5 weights, ELMoForManyLangs, token-embedding files, the export spec and manifest.
May import: elmo_core, storage (tests/test_layers.py)."""
from __future__ import annotations

from elmo_core.lazy_names import lazy_names
from elmo_core.process_env import settle

settle()  # before any module here loads torch: the environment torch reads when it loads (elmo_core/process_env.py)

# Each name's module, imported on first use (elmo_core.lazy_names).
_HOMES = {
    "ModelFiles": "model_dir", "load_bilm": "model_dir", "resolve_model": "model_dir",
    "save_model": "model_dir"
}

__all__ = list(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES, globals())
