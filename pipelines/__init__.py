"""`elmo embed`: Parquet (or text) corpora through the engine into Parquet or hdf5 vectors, exactly once, locally or on Ray.
May import: elmo_core, storage, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
from __future__ import annotations

from elmo_core.lazy_names import lazy_names
from elmo_core.process_env import settle

settle()  # before any module here loads torch: the environment torch reads when it loads (elmo_core/process_env.py)

# Each name's module, imported on first use (elmo_core.lazy_names).
_HOMES = {
    "embed_parquet": "job", "ElmoLayersDataset": "layers_dataset", "collate_layers": "layers_dataset",
    "EmbedOptions": "options", "OutputDirError": "errors", "ElmoPredictor": "predictor",
    "ELMO_COLUMN": "schema", "elmo_type": "schema"
}

__all__ = list(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES, globals())
