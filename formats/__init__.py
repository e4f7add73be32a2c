"""The files the project reads and writes: model directories (model_dir.py), the published hdf5 weights, ELMoForManyLangs, token-embedding files, the export spec and manifest.
May import: elmo_core (tests/test_layers.py)."""
import elmo_core.process_env  # noqa: F401 (first: the environment torch reads when it loads)
from .model_dir import ModelFiles, load_bilm, resolve_model, save_model

__all__ = ["ModelFiles", "load_bilm", "resolve_model", "save_model"]
