"""Typed errors of the export package (the CLI maps every ElmoError to exit code 2)."""
from __future__ import annotations

from elmo_core.errors import ElmoError


class ExportError(ElmoError):
    """An export that cannot be built, written or read back (bad spec, manifest or graph)."""


class ParityError(ExportError):
    """An exported graph whose outputs differ from the torch backend beyond the spec's tolerance."""


class UnsupportedOpError(ExportError):
    """A graph that uses an ONNX op TensorRT's ONNX parser does not support."""


class EngineMismatchError(ExportError):
    """A TensorRT engine built for another TensorRT version, GPU or ONNX graph than the running one."""


class TensorRTUnavailableError(ExportError):
    """TensorRT (the `tensorrt` extra) or a CUDA GPU is not available on this machine."""
