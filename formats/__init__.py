"""The files the project reads and writes: model directories (model_dir.py), the published hdf5 weights, ELMoForManyLangs, token-embedding files, the export spec and manifest.
May import: elmo_core (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
from .model_dir import ModelFiles, load_bilm, resolve_model, save_model

__all__ = ["ModelFiles", "load_bilm", "resolve_model", "save_model"]
