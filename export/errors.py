"""Typed errors raised while building an export (reading one raises inference.errors.ExportError)."""
from __future__ import annotations

from formats.errors import ExportError


class ParityError(ExportError):
    """An exported graph whose outputs differ from the torch backend beyond the spec's tolerance."""


class UnsupportedOpError(ExportError):
    """A graph that uses an ONNX op TensorRT's ONNX parser does not support."""
