"""A calibration sample: the first sentences of an ``elmo embed`` INPUT (Parquet files, or a text
file of one sentence a line), on which ``--backend onnx`` plans and validates reduced precision
(``export.quantize``, ``export.text_parity``)."""
from __future__ import annotations

import itertools
from pathlib import Path

from elmo_core.errors import InputError
from export.text_parity import SAMPLE_SENTENCES
from inference.batching import cpu_batch_budget

from .hdf5_output import is_text_input, parquet_sentences, text_sentences
from .options import EmbedOptions
from .source import scan_inputs



def calibration_sample(spec: str | Path, text_column: str = "text", tokens_column: str | None = None,
                       rows: int = SAMPLE_SENTENCES) -> tuple[list[list[str]], str]:
    """(the tokens of the first ``rows`` non-empty rows of ``spec``, where they come from)."""
    if is_text_input(spec):
        found = (tokens for _, tokens, _ in text_sentences(Path(spec)))
    else:
        opts = EmbedOptions(text_column=text_column, tokens_column=tokens_column,
                            sort_window_rows=cpu_batch_budget().window_rows)  # read as a CPU job reads
        found = (tokens for _, tokens, _ in parquet_sentences(scan_inputs(spec, opts), opts, {"invalid_utf8": 0}))
    sentences = list(itertools.islice((t for t in found if t), rows))
    return sentences, f"the first {len(sentences)} rows of {spec}"


def user_calibration(spec: str | Path, text_column: str = "text",
                     tokens_column: str | None = None) -> tuple[list[list[str]], str]:
    """``--calibration INPUT``'s sample; InputError naming INPUT when none of its rows has text (a
    job's own INPUT without text falls back to the default sample instead)."""
    sample = calibration_sample(spec, text_column, tokens_column)
    if not sample[0]:
        raise InputError(f"--calibration {spec}: no row with text to plan and validate on; pass Parquet files with "
                         f"a '{tokens_column or text_column}' column or a text file of one sentence a line")
    return sample
