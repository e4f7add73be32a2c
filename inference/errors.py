"""Typed errors of the inference package; ``ExportError`` is the export format's (``formats.errors``).
The CLI maps every ElmoError to exit code 2."""
from __future__ import annotations

from elmo_core.errors import ElmoError, InputError, WeightsError
from formats.errors import ExportError


class EngineMismatchError(ExportError):
    """A TensorRT engine built for another TensorRT version, GPU or ONNX graph than the running one."""


class TensorRTUnavailableError(ExportError):
    """TensorRT (the `tensorrt` extra) or a CUDA GPU is not available on this machine."""


class BackendUnavailableError(InputError):
    """The backend asked for is unknown, not installed, or cannot reach the device asked for."""


class ModelChangedError(WeightsError):
    """A model's files are not the ones a run was pinned to (``ModelRun.pinned``): replaced or edited
    after a job recorded their sha256."""


class NonFiniteError(ElmoError):
    """Vectors that hold inf or NaN (a scale such as ``gamma`` past the dtype's range, or a model
    whose weights give them); ``row`` is the sentence's (or row's) index in what was asked."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row

    @staticmethod
    def advice(dtype: str, gamma: float, flags: bool = False) -> str:
        """What the message says of the vectors and what to do: the settings named as the library
        names them, or (``flags``) as the CLI's flags."""
        g, d = ("--gamma", "--dtype") if flags else ("gamma", "dtype")
        return (f"its vectors hold inf or NaN ({dtype}, {g} {gamma:g}): the model's output times {g} overflows "
                f"{dtype}, or the model's weights give non-finite values; use a smaller {g} or {d} float32, else "
                f"check the model")
