"""Every name a user picks, listed once. The CLI's choices, the server's request schema, the
options' validation and the export's options are all generated from these tuples (the default
first where there is one). Backends are ``inference.registry``'s (each name is its loader).
"""
from __future__ import annotations

OUTPUT_MODES = ("mixed", "top", "average", "all")  # what becomes of the L+1 layers (inference.outputs)
POOLS = ("mean", "max")  # one vector per sentence, over its tokens (elmo_core.pooling)
DTYPES = ("float32", "float16")  # of the vectors written or answered
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # the torch backend's matrix products (inference.precision)
EXPORT_PRECISIONS = ("fp32", "fp16", "bf16", "int8")  # of an ONNX export (formats.export_spec)
# those an export can be validated in on a CPU (bf16 graphs do not run on ONNX Runtime's CPU provider):
# `elmo engine`, and the exports `--backend onnx --precision` builds on demand (export.cache)
VALIDATED_EXPORT_PRECISIONS = tuple(p for p in EXPORT_PRECISIONS if p != "bf16")
OUTPUT_FORMATS = ("parquet", "hdf5")  # what elmo embed writes
ENGINES = ("local", "ray", "spark")  # where elmo embed's batches run
ENCODINGS = ("float", "base64")  # how elmo serve answers vectors
