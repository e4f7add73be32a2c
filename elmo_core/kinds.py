"""The names users pick that carry facts, one frozen record each: an output dtype (its torch, numpy
and Arrow types), an output mode (what becomes of the L+1 layers: a layer axis kept, one layer, the
average or the mix) and a precision (its products' torch type, which backends run it).
``elmo_core.names`` lists their names in the order the CLI offers them. A precision's parity
tolerances are the export's: ``formats.export_spec.TOLERANCES`` and ``TEXT_MIN_COSINE``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from .errors import InputError, shown

if TYPE_CHECKING:
    import torch

LAYER_OUTPUT = "layer:"  # "layer:N": layer N alone, 0 (the char-CNN's token layer, [x; x]) to L


def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    return getattr(torch, name)


class _Named:
    """A record looked up by its name (``of``): the names are ``ALL``'s keys."""

    ALL: ClassVar[dict[str, Any]]

    @classmethod
    def _choices(cls) -> object:
        return tuple(cls.ALL)

    @classmethod
    def of(cls, name: "str | Self") -> Self:
        """The record of a name (a record is itself); InputError for an unknown one."""
        if isinstance(name, cls):
            return name
        if name not in cls.ALL:
            raise InputError(f"{cls.__name__.lower()} must be one of {cls._choices()}, got {name!r}")
        return cls.ALL[name]


@dataclass(frozen=True)
class Dtype(_Named):
    """The type the vectors are written or answered in."""

    name: str
    numpy: np.dtype
    ALL: ClassVar[dict[str, "Dtype"]]

    @property
    def torch(self) -> "torch.dtype":
        """The torch type (torch imported here, on first use: the CLI's parsers read these records)."""
        return _torch_dtype(self.name)

    @classmethod
    def of_numpy(cls, dtype: Any) -> "Dtype":
        """The record of a numpy dtype (``np.float16``, ``array.dtype``)."""
        return cls.of(np.dtype(dtype).name)

    @property
    def itemsize(self) -> int:
        """Bytes per value."""
        return self.numpy.itemsize

    @property
    def max(self) -> float:
        """The largest finite value."""
        return float(np.finfo(self.numpy).max)


Dtype.ALL = {d.name: d for d in (Dtype("float32", np.dtype(np.float32)), Dtype("float16", np.dtype(np.float16)))}


@dataclass(frozen=True)
class OutputMode:
    """What becomes of a sentence's L+1 layers (each 2P wide): kept (``layer_axis``: (T, L+1, 2P)),
    or one 2P vector per token: one layer (``layer``: its index, -1 the top), their average, or
    their scalar mix (``mixes``: it takes mix weights, gamma and layer norm)."""

    name: str
    layer_axis: bool = False
    layer: int | None = None
    mixes: bool = False
    ALL: ClassVar[dict[str, "OutputMode"]]

    @classmethod
    def of(cls, name: str) -> "OutputMode":
        """The record of an output mode (``layer:N`` included); InputError for anything else."""
        if name in cls.ALL:
            return cls.ALL[name]
        number = name[len(LAYER_OUTPUT):] if name.startswith(LAYER_OUTPUT) else ""
        if number.isascii() and number.isdigit() and len(number) <= 9:  # ASCII digits only: int() takes any script's
            return cls(name, layer=int(number))
        raise InputError(f"output mode must be one of {tuple(cls.ALL)} or {LAYER_OUTPUT}N, got {shown(name)}")

    def shape(self, n_layers: int, dim: int) -> tuple[int, ...]:
        """One token's vectors. Shape: -> (L+1, 2P) with the layer axis, else (2P,)."""
        return (n_layers, dim) if self.layer_axis else (dim,)


OutputMode.ALL = {m.name: m for m in (OutputMode("mixed", mixes=True), OutputMode("top", layer=-1),
                                      OutputMode("average"), OutputMode("all", layer_axis=True))}


@dataclass(frozen=True)
class Precision(_Named):
    """A precision of the matrix products: the type their inputs are rounded to by us (``rounds_to``
    by name, ``torch`` its torch type; None: not the torch backend's); ``gpu_rounds``: the GPU's tensor cores round them instead (tf32,
    so CUDA only; fp32 here); whether the torch backend runs it and whether an ONNX export is built
    in it (the onnx and tensorrt backends run an export's precision), and then ``onnx``: the
    ``onnx.TensorProto`` type its products' weights are stored in (int8: an fp32 graph, quantized
    after), and ``cpu_validated``: whether it is validated on a CPU (ONNX Runtime's CPU provider runs
    no bf16 graph)."""

    name: str
    rounds_to: str | None  # the torch type its products' inputs are rounded to, by name
    torch_backend: bool = True
    gpu_rounds: bool = False
    onnx: str | None = None
    cpu_validated: bool = True
    trains: bool = False  # ``elmo train`` runs in it (bf16: autocast, the parameters and state in fp32)
    tensorrt: bool = False  # TensorRT builds an engine of an export in it (strongly typed: the export's own types)
    ALL: ClassVar[dict[str, "Precision"]]  # the torch backend's first, in the order the CLI offers them
    EXPORT_ORDER: ClassVar[tuple[str, ...]] = ("fp32", "fp16", "bf16", "int8")  # as `elmo export` offers them

    @classmethod
    def _choices(cls) -> object:
        return list(cls.ALL)

    @property
    def exported(self) -> bool:
        """An ONNX export is built in it; the onnx and tensorrt backends run it."""
        return self.onnx is not None

    @property
    def torch(self) -> "torch.dtype | None":
        """The torch type its products' inputs are rounded to (torch imported here, on first use)."""
        return None if self.rounds_to is None else _torch_dtype(self.rounds_to)

    @property
    def reduced(self) -> bool:
        """Its products' inputs are rounded to a 16-bit float type."""
        return self.rounds_to in ("bfloat16", "float16")


Precision.ALL = {p.name: p for p in (
    Precision("fp32", "float32", onnx="FLOAT", trains=True, tensorrt=True), Precision("tf32", "float32", gpu_rounds=True),
    Precision("bf16", "bfloat16", onnx="BFLOAT16", cpu_validated=False, trains=True),
    Precision("fp16", "float16", onnx="FLOAT16", tensorrt=True), Precision("int8", None, torch_backend=False, onnx="FLOAT"))}
