"""`elmo embed`: Parquet (or text) corpora through the engine into Parquet or hdf5 vectors, exactly once, locally or on Ray.
May import: elmo_core, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
from .job import embed_parquet
from .layers_dataset import ElmoLayersDataset, collate_layers
from .options import EmbedOptions, OutputDirError
from .predictor import ElmoPredictor
from .schema import ELMO_COLUMN, elmo_type

__all__ = ["embed_parquet", "EmbedOptions", "OutputDirError", "ElmoPredictor", "ELMO_COLUMN", "elmo_type", "ElmoLayersDataset",
           "collate_layers"]
