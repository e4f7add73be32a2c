"""Every name a user picks, listed once. The CLI's choices, the server's request schema, the
options' validation and the export's options are all generated from these tuples (the default
first where there is one). Output modes, dtypes and precisions are records that carry their facts
(``elmo_core.kinds``); these tuples are their names. Backends are ``inference.registry``'s.
"""
from __future__ import annotations

from .errors import InputError, SettingError
from .kinds import Dtype, OutputMode, Precision

OUTPUT_MODES = tuple(OutputMode.ALL)  # what becomes of the L+1 layers (inference.outputs); also layer:N
# The output names of TF-Hub's ELMo module and Spark NLP's ElmoEmbeddings, as (output, pool). Their
# word_emb is x (P wide); layer:0 here is [x; x] (2P), as AllenNLP's layer 0.
HUB_OUTPUTS = {"elmo": ("mixed", None), "default": ("mixed", "mean"), "word_emb": ("layer:0", None),
               "lstm_outputs1": ("layer:1", None), "lstm_outputs2": ("layer:2", None)}
OUTPUT_NAMES = f"{', '.join(OUTPUT_MODES)}, layer:N, or TF-Hub's {', '.join(HUB_OUTPUTS)}"
POOLS = ("mean", "max")  # one vector per sentence, over its tokens (elmo_core.pooling)
DTYPES = tuple(Dtype.ALL)  # of the vectors written or answered
PRECISIONS = tuple(p.name for p in Precision.ALL.values() if p.torch_backend)  # inference.precision
TRAIN_PRECISIONS = tuple(p.name for p in Precision.ALL.values() if p.trains)  # training.options
EXPORT_PRECISIONS = tuple(p for p in Precision.EXPORT_ORDER if Precision.of(p).exported)  # formats.export_spec
# those an export can be validated in on a CPU: `elmo engine`, and the exports `--backend onnx
# --precision` builds on demand (export.cache)
VALIDATED_EXPORT_PRECISIONS = tuple(p for p in EXPORT_PRECISIONS if Precision.of(p).cpu_validated)
TENSORRT_PRECISIONS = tuple(p for p in EXPORT_PRECISIONS if Precision.of(p).tensorrt)  # export.tensorrt
OUTPUT_FORMATS = ("parquet", "arrow", "hdf5")  # what elmo embed writes (pipelines.shard_files: the first two)
VECTOR_LAYOUTS = ("floats", "binary")  # a token's vector in a shard (pipelines.schema)
ENGINES = ("local", "ray", "spark")  # where elmo embed's batches run
# how the torch backend runs the recurrence (inference.layout): measured per CPU, or packed / fused / rows
LAYOUTS = ("auto", "packed", "fused", "rows")
ENCODINGS = ("float", "base64")  # how elmo serve answers vectors


def resolve_output(output: str, pool: str | None) -> tuple[str, str | None]:
    """(output mode, pool) for an output name (``OUTPUT_NAMES``): TF-Hub's names made ours, ``layer:N``
    checked for form (N against the model where the layers are known); SettingError otherwise."""
    if not isinstance(output, str):
        raise SettingError(f"`output` must be one of {OUTPUT_NAMES}, got {type(output).__name__} {output!r}")
    if output in HUB_OUTPUTS:
        mode, implied = HUB_OUTPUTS[output]
        if implied is not None and pool not in (None, implied):
            raise SettingError(f"`output` {output!r} is the {implied} pool of the mix; give `pool` {implied} or none")
        return mode, pool if implied is None else implied
    try:
        OutputMode.of(output)
    except InputError:
        raise SettingError(f"`output` must be one of {OUTPUT_NAMES}, got {output!r}") from None
    return output, pool


def comma_separated(text: str, setting: str) -> list[str]:
    """The items of a comma-separated list a user wrote (``--mix 1,2,3``, ``--keep-columns a,b``),
    each stripped; none for a blank text. An empty item (``1,,2``, ``a,b,``) is a SettingError naming
    the ``setting`` (its field name) and the item's place: a value left out, which dropping it would
    hide."""
    if not text.strip():
        return []
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise SettingError(f"`{setting}`: item {items.index('') + 1} of {text!r} is empty; give the items "
                           f"separated by single commas")
    return items
