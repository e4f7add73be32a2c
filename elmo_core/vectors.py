"""What becomes of the biLM's L+1 layers, as one record: ``VectorRequest`` (the output mode, the
scalar mix, pooling, unit length, the dtype), made and checked once where a door reads it (``elmo
embed``'s flags are its fields, an HTTP body, the export's ``ExportSpec``, a library call), then
passed down unchanged. ``layer_weights`` is a fixed weighting of the layers as numbers;
``inference.outputs`` applies a request to a batch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .bounds import check_flags, setting
from .errors import InputError, SettingError, shown
from .kinds import Dtype, OutputMode
from .mix_settings import check_mix_settings
from .names import DTYPES, HUB_OUTPUTS, OUTPUT_NAMES, POOLS, comma_separated, resolve_output


@dataclass(frozen=True)
class VectorRequest:
    """What each sentence's vectors become: the output mode (``mix``: ScalarMix's unnormalised s;
    ``layer_norm``: each layer normalised over a model batch's tokens first, as bilm-tf's
    ``weight_layers``), then ``pool`` (one vector per sentence) or not, ``normalize`` (unit L2 norm,
    last of all) and the ``dtype`` they are delivered in."""

    output: str = setting("mixed", f"what becomes of the layers: {OUTPUT_NAMES}", "vectors")
    mix: tuple[float, ...] | None = setting(None, "scalar mix weights s0,s1,... (before softmax; default equal)",
                                            "vectors")
    gamma: float = setting(1.0, "the scalar mix's scale", "vectors")
    layer_norm: bool = setting(False, cli=False)
    pool: str | None = setting(None, "one vector per row, pooled over its tokens (null for an empty row)", "vectors",
                               choices=POOLS, parquet_only=True)
    normalize: bool = setting(False, "scale each vector (per token and layer, or pooled with --pool) to unit L2 "
                              "norm", "vectors")
    dtype: str = setting("float32", "the vectors' type", "vectors", choices=DTYPES)

    def __post_init__(self) -> None:
        check_flags(self)
        if self.pool is not None and self.pool not in POOLS:
            raise SettingError(f"`pool` must be None or one of {POOLS}, got {shown(self.pool)}")
        asked = self.output if self.output in HUB_OUTPUTS else None  # named as given in errors (``word_emb``)
        output, pool = resolve_output(self.output, self.pool)  # TF-Hub's names: ours
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "pool", pool)  # one of POOLS: the one asked for, or the one implied
        object.__setattr__(self, "_mode", OutputMode.of(output))  # read by every batch: looked up once
        object.__setattr__(self, "_dtype", Dtype.of(self.dtype))
        if self.mix is not None:
            object.__setattr__(self, "mix", _mix(self.mix))
        check_mix_settings(self.mix, self.gamma, f"{asked} ({output})" if asked else output, self.mode.mixes,
                           self.vector_dtype.max, self.dtype)
        if self.layer_norm and not self.mode.mixes:
            raise SettingError(f"`layer_norm` only applies to the mix (`output` mixed: each layer normalised before "
                               f"the weighted sum), not to `output` {asked or output}: leave it out")

    @property
    def mode(self) -> OutputMode:
        """The output mode's record (its layer axis, its one layer, whether it mixes)."""
        return self._mode  # type: ignore[attr-defined]

    @property
    def vector_dtype(self) -> Dtype:
        """The output dtype's record (its torch, numpy and Arrow types)."""
        return self._dtype  # type: ignore[attr-defined]

    def weights(self, n_layers: int) -> np.ndarray | None:
        """The output mode as one weight per layer (``layer_weights``); None where it is not a fixed
        weighting (all layers, or the layer-normalised mix). Shape: -> (L+1,) float64 or None."""
        return _request_weights(self, n_layers)

    def to_dict(self) -> dict[str, Any]:
        """Its fields as JSON takes them (a job's identity, a manifest); ``layer_norm`` only where set
        (the keys of every record written before it was one)."""
        return {"output": self.output, "mix": None if self.mix is None else list(self.mix), "gamma": self.gamma,
                **({"layer_norm": True} if self.layer_norm else {}), "pool": self.pool, "normalize": self.normalize,
                "dtype": self.dtype}


def _mix(given: Sequence[float] | str) -> tuple[float, ...]:
    """The mix's weights s as floats, from numbers or a flag's text (``s0,s1,...``)."""
    items = comma_separated(given, "mix") if isinstance(given, str) else given  # an empty item named by its place
    try:
        values = tuple(items)  # read once: a generator too
        if any(isinstance(m, bool) for m in values):
            raise TypeError("a bool is no weight")
        return tuple(float(m) for m in values)
    except (TypeError, ValueError):
        raise SettingError(f"`mix` must be numbers (s0,s1,...), got {given!r}") from None


@functools.lru_cache(maxsize=64)
def _request_weights(request: VectorRequest, n_layers: int) -> np.ndarray | None:
    """``VectorRequest.weights``, computed once per request and model (the engine asks per batch)."""
    if request.layer_norm and request.mode.mixes:
        check_output(request.mode, n_layers, request.mix)
        return None
    return layer_weights(request.mode, n_layers, request.mix, request.gamma)  # shared: callers only read it


def _mode(output: str | OutputMode) -> OutputMode:
    """An output mode's record from its name (TF-Hub's names too) or the record itself."""
    return output if isinstance(output, OutputMode) else OutputMode.of(resolve_output(output, None)[0])


def check_output(output: str | OutputMode, n_layers: int, mix_weights: Sequence[float] | None) -> None:
    """An output mode (a name, or a request's record: ``VectorRequest.mode``) against a model of
    ``n_layers`` output layers."""
    mode = _mode(output)
    if mode.layer is not None and mode.layer >= n_layers:
        raise InputError(f"output {mode.name}: the model has layers 0 to {n_layers - 1}")
    if mix_weights is not None and len(mix_weights) != n_layers:
        raise SettingError(f"`mix`: expected {n_layers} values (one per output layer of the model), got "
                           f"{len(mix_weights)}")


def layer_weights(output: str | OutputMode, n_layers: int, mix_weights: Sequence[float] | None = None,
                  gamma: float = 1.0) -> np.ndarray | None:
    """The output mode as one weight per layer, where it is a linear combination of the layers:
    top and layer:N (one-hot), average (1 / (L+1) each), mixed (``gamma * softmax(s)``, ScalarMix's own
    normalisation, in float64); None for all. ``inference.outputs.reduce_layers`` is the reference
    these weights must match; the mixed ONNX export bakes the same weights in.

    Shape: -> (L+1,) float64, or None.
    """
    check_output(output, n_layers, mix_weights)
    mode = _mode(output)
    if mode.layer_axis:
        return None
    if mode.layer is not None:
        return np.eye(n_layers)[mode.layer]
    if not mode.mixes:  # the average
        return np.full(n_layers, 1.0 / n_layers)
    from .scalar_mix import ScalarMix

    return ScalarMix(n_layers, mix_weights, gamma).layer_weights()
