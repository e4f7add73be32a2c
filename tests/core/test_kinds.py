"""The records behind the names users pick: the CLI's tuples are their names, and each record's
facts are the ones its users used to spell out."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from elmo_core.errors import InputError
from elmo_core.kinds import Dtype, OutputMode, Precision
from elmo_core.names import (DTYPES, EXPORT_PRECISIONS, OUTPUT_MODES, PRECISIONS, TENSORRT_PRECISIONS, TRAIN_PRECISIONS,
                             VALIDATED_EXPORT_PRECISIONS)
from elmo_core.vectors import VectorRequest
from pipelines.schema import arrow_float, elmo_type


def test_the_tuples_are_the_records_names_in_the_clis_order():
    assert OUTPUT_MODES == ("mixed", "top", "average", "all")
    assert DTYPES == ("float32", "float16")
    assert PRECISIONS == ("fp32", "tf32", "bf16", "fp16")
    assert TRAIN_PRECISIONS == ("fp32", "bf16")
    assert EXPORT_PRECISIONS == ("fp32", "fp16", "bf16", "int8")
    assert VALIDATED_EXPORT_PRECISIONS == ("fp32", "fp16", "int8")
    assert TENSORRT_PRECISIONS == ("fp32", "fp16")


@pytest.mark.parametrize("name, torch_type, numpy_type, arrow_type, size", [
    ("float32", torch.float32, np.float32, pa.float32(), 4), ("float16", torch.float16, np.float16, pa.float16(), 2)])
def test_a_dtype_carries_its_types(name, torch_type, numpy_type, arrow_type, size):
    d = Dtype.of(name)
    assert (d.torch, d.numpy, arrow_float(d), d.itemsize) == (torch_type, np.dtype(numpy_type), arrow_type, size)
    assert Dtype.of_numpy(numpy_type) is d and d.max == float(np.finfo(numpy_type).max)
    with pytest.raises(InputError, match="dtype must be one of"):
        Dtype.of("int8")


def test_an_output_mode_says_what_becomes_of_the_layers():
    assert [OutputMode.of(m).layer_axis for m in OUTPUT_MODES] == [False, False, False, True]
    assert OutputMode.of("top").layer == -1 and OutputMode.of("layer:2").layer == 2 and OutputMode.of("mixed").mixes
    assert OutputMode.of("all").shape(3, 8) == (3, 8) and OutputMode.of("layer:0").shape(3, 8) == (8,)
    with pytest.raises(InputError):
        OutputMode.of("layer:x")


def test_the_parquet_type_follows_the_records():
    f16 = pa.float16()
    assert elmo_type(8, 3, VectorRequest("all", dtype="float16")) == pa.list_(pa.list_(pa.list_(f16, 8), 3))
    assert elmo_type(8, 3, VectorRequest("top", pool="mean")) == pa.list_(pa.float32(), 8)


def test_a_precision_says_who_runs_it():
    assert Precision.of("tf32").gpu_rounds and not Precision.of("tf32").exported
    assert not Precision.of("int8").torch_backend and Precision.of("int8").onnx == "FLOAT"
    assert [p for p in PRECISIONS if Precision.of(p).reduced] == ["bf16", "fp16"]
