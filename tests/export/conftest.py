from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from export.onnx_graph import build_onnx
from formats import load_bilm
from formats.export_spec import ExportSpec


@pytest.fixture
def fp32_graph(tiny_dir, tmp_path) -> Path:
    """The tiny model's fp32 graph as an int8 export builds it before quantizing."""
    bilm = load_bilm(tiny_dir)
    path = tmp_path / "fp32.onnx"
    onnx.save(build_onnx(bilm, ExportSpec.for_config(bilm.config, precision="int8")), str(path))
    return path
