"""Every name a user picks, listed once. The CLI's choices, the server's request schema, the
options' validation and the export's options are all generated from these tuples (the default
first where there is one). Backends are ``inference.registry``'s (each name is its loader).
"""
from __future__ import annotations

from .errors import InputError

OUTPUT_MODES = ("mixed", "top", "average", "all")  # what becomes of the L+1 layers (inference.outputs)
LAYER_OUTPUT = "layer:"  # "layer:N": layer N alone, 0 (the char-CNN's token layer, [x; x]) to L
# The output names of TF-Hub's ELMo module and Spark NLP's ElmoEmbeddings, as (output, pool). Their
# word_emb is x (P wide); layer:0 here is [x; x] (2P), as AllenNLP's layer 0.
HUB_OUTPUTS = {"elmo": ("mixed", None), "default": ("mixed", "mean"), "word_emb": ("layer:0", None),
               "lstm_outputs1": ("layer:1", None), "lstm_outputs2": ("layer:2", None)}
OUTPUT_NAMES = f"{', '.join(OUTPUT_MODES)}, layer:N, or TF-Hub's {', '.join(HUB_OUTPUTS)}"
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


def resolve_output(output: str, pool: str | None) -> tuple[str, str | None]:
    """(output mode, pool) for an output name (``OUTPUT_NAMES``): TF-Hub's names made ours, ``layer:N``
    checked for form (N against the model where the layers are known); InputError otherwise."""
    if output in HUB_OUTPUTS:
        mode, implied = HUB_OUTPUTS[output]
        if implied is not None and pool not in (None, implied):
            raise InputError(f"output {output!r} is the {implied} pool of the mix; give pool {implied} or none")
        return mode, pool if implied is None else implied
    if output in OUTPUT_MODES or (output.startswith(LAYER_OUTPUT) and output[len(LAYER_OUTPUT):].isdigit()):
        return output, pool
    raise InputError(f"output must be one of {OUTPUT_NAMES}, got {output!r}")


def layer_index(output: str) -> int | None:
    """N of ``layer:N``; None for the other outputs."""
    return int(output[len(LAYER_OUTPUT):]) if output.startswith(LAYER_OUTPUT) else None
