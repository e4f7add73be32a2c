"""pipelines: stream Parquet corpora through a biLM backend into Parquet ELMo vectors (``elmo embed``).

See docs/pipelines.md for the output schema, resume semantics and windowing.
"""
from .job import embed_parquet
from .layers_dataset import ElmoLayersDataset, collate_layers
from .options import EmbedOptions, OutputDirError
from .predictor import ElmoPredictor
from .schema import ELMO_COLUMN, elmo_type

__all__ = ["embed_parquet", "EmbedOptions", "OutputDirError", "ElmoPredictor", "ELMO_COLUMN", "elmo_type", "ElmoLayersDataset",
           "collate_layers"]
