"""int8: ONNX Runtime's dynamic quantization of the biLM's matrix products, the products whose error
dominates on this model kept in fp32.

Every quantized product is ``onnxruntime.quantization.quantize_dynamic``'s: weights int8 with a scale
per output column (``per_channel``), activations uint8 with one scale per tensor, computed per batch
(``DynamicQuantizeLinear``). The weights' range is chosen per CPU (``weight_bits``): 8 bits where the
CPU multiplies int8 with VNNI or AMX (exact int32 sums), 7 bits (``reduce_range``) elsewhere, where
the AVX2 / AVX-512 u8s8 kernels sum byte pairs into saturating int16 (on ``models/default``, 8-bit
weights cut each group's error 2-4x: the char-CNN projection alone 0.9935 -> 0.9985). The recurrent
products inside the Scan bodies are quantized too (``EnableSubgraph``).

Trained weights and their activations make that per-tensor activation scale and 7-bit weights lose
more than random weights do: on ``models/default`` every product quantized keeps a min token
cosine of only 0.994 against fp32 on held-out text (random full-size weights: 0.9998). So the
products are grouped by component (char-CNN highway and projection, each biLSTM layer's input
products, recurrent products and projections) and chosen on a sample of text (the calibration
sample): each group alone is measured, then the groups are added from the least error per multiply-add
to the most (the products run per token before the char-CNN's, run once per distinct token) while
the whole graph keeps every layer's token cosine at or above the target, on the sample and,
scaled to the same allowance, on the random-token shapes validation also holds it to (long random
tokens drive the recurrence where text seldom does); the others stay in fp32. A group of the main
graph (the char-CNN's, each layer's input products) is also measured alone with per-token scales
(``export.row_scales``), and takes them where it only fits the plan with them. ``Int8Plan`` records
which were quantized, which with per-token scales, which were kept and each one's own score.
Static quantization calibrated on the same text (``quantize_static``, MinMax ranges, QOperator or
QDQ) measured worse on ``models/default`` (min token cosine 0.9925 with only the char-CNN and input
products quantized, against 0.9988 dynamic), so it is not used.
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import onnx

from inference.precision import INT8_CPU_FLAGS

from .errors import ParityError
from .row_scales import scale_rows, top_level_matmuls
from .tensorrt_ops import iter_graphs, subgraphs

# A product's group, from its weight's initializer name (``onnx_char_cnn`` / ``onnx_lstm`` name them).
_GROUPS = ((re.compile(r"conv_w_\d+"), "char_cnn.convolutions"), (re.compile(r"hw_w_\d+"), "char_cnn.highway"),
           (re.compile(r"proj_w_\d+"), "char_cnn.projection"), (re.compile(r"w_input_(\d+)_\d_\d+"), "input"),
           (re.compile(r"l(\d+)_w_state_\d_\d+"), "recurrent"), (re.compile(r"l(\d+)_w_proj_\d_\d+"), "projection"))


def group_of(weight: str) -> str | None:
    """The group of a MatMul whose weight initializer is ``weight``: ``char_cnn.highway``,
    ``bilstm1.recurrent`` (biLSTM layer 1 = output layer 1), ...; None for an unknown name."""
    for pattern, name in _GROUPS:
        m = pattern.fullmatch(weight)
        if m:
            return f"bilstm{int(m.group(1)) + 1}.{name}" if m.groups() else name
    return None


def matmul_groups(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """The graph's MatMul node names by group, Scan bodies included, in graph order."""
    groups: dict[str, list[str]] = {}

    def walk(graph: onnx.GraphProto) -> None:
        inits = {t.name for t in graph.initializer}
        for node in graph.node:
            weights = [i for i in node.input if i in inits]
            group = group_of(weights[0]) if node.op_type == "MatMul" and weights else None
            if group is not None:
                groups.setdefault(group, []).append(node.name)
            for body in subgraphs(node):
                walk(body)
    walk(proto.graph)
    return groups


def weight_bits(flags: frozenset[str]) -> int:
    """The int8 weights' range on a CPU reporting ``flags``: 8 bits with VNNI or AMX (exact int32
    products), 7 on AVX2 / AVX-512 without them (saturating int16 pair sums)."""
    return 8 if any(f in flags for f in INT8_CPU_FLAGS) else 7


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The quantizer logs a pre-processing hint and per-tensor notes through the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def row_scalable(proto: onnx.ModelProto) -> list[str]:
    """The groups whose products may take per-token scales (``export.row_scales``): those of the main graph."""
    top = top_level_matmuls(proto)
    return [g for g, names in matmul_groups(proto).items() if set(names) <= top]


def group_values(proto: onnx.ModelProto) -> dict[str, int]:
    """What each group's products cost a token: the multiply-adds of its weights (K x N, summed), or 0
    for the char-CNN's where the graph runs it once per distinct token (``Unique``): on
    ``models/default`` those took ~3 % of ONNX Runtime's time against 21 % for the input products."""
    dedup = any(n.op_type == "Unique" for n in proto.graph.node)
    sizes: dict[str, int] = {}
    for graph in iter_graphs(proto.graph):
        for t in graph.initializer:
            group = group_of(t.name)
            if group is not None and len(t.dims) == 2:
                sizes[group] = sizes.get(group, 0) + int(t.dims[0]) * int(t.dims[1])
    return {g: 0 if dedup and g.startswith("char_cnn.") else v for g, v in sizes.items()}


def quantize_int8(src: Path, dst: Path, keep_fp32: Sequence[str] = (), bits: int = 7,
                  row_scaled: Sequence[str] = ()) -> None:
    """``src`` (fp32) with every MatMul weight quantized to ``bits`` (``weight_bits``) as described
    above, except the groups in ``keep_fp32``, the groups in ``row_scaled`` with per-token scales,
    written to ``dst``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(src))
    groups = matmul_groups(proto)
    exclude = [name for g in keep_fp32 for name in groups.get(g, [])]
    scale_rows(proto, [name for g in row_scaled if g not in keep_fp32 for name in groups.get(g, [])])
    with _quiet_quantizer():
        quantize_dynamic(proto, str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         reduce_range=bits == 7, per_channel=True, nodes_to_exclude=exclude,
                         extra_options={"EnableSubgraph": True})


# What an int8 plan of the same model, sample and CPU gives; a new value re-plans on-demand exports
# (``export.cache.export_key``).
PLAN_VERSION = 3


@dataclass
class Int8Plan:
    """Which product groups are int8 and which stayed fp32, and the score (``Measure``: the min token
    cosine of every layer on the calibration sample, or the random shapes' scaled) each group gave
    quantized alone."""

    target: float
    bits: int = 7
    quantized: list[str] = field(default_factory=list)
    kept_fp32: list[str] = field(default_factory=list)
    row_scaled: list[str] = field(default_factory=list)
    alone: dict[str, float] = field(default_factory=dict)
    alone_rows: dict[str, float] = field(default_factory=dict)
    all_quantized: float | None = None
    min_cosine: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {"target_min_cosine": self.target, "weight_bits": self.bits, "quantized": self.quantized,
                "kept_fp32": self.kept_fp32, "row_scaled": self.row_scaled,
                "alone_min_cosine": {g: round(c, 6) for g, c in self.alone.items()},
                "alone_row_scaled_min_cosine": {g: round(c, 6) for g, c in self.alone_rows.items()},
                "all_quantized_min_cosine": self.all_quantized, "min_cosine": self.min_cosine, "describe": self.describe()}

    def order(self, values: dict[str, int]) -> list[str]:
        """The groups in the order the plan adds them: the least error per multiply-add first (the
        per-token products before those run once per distinct token, value 0), by ``score``."""
        def key(g: str) -> tuple[bool, float]:
            error = 1.0 - self.score(g)
            return (values.get(g, 0) == 0, error / values[g] if values.get(g) else error)
        return sorted(self.alone, key=key)

    def score(self, group: str) -> float:
        """``group``'s score alone as the plan first tries it: as it is where that holds the target,
        else with per-token scales where it was measured with them."""
        if self.alone[group] >= self.target:
            return self.alone[group]
        return max(self.alone[group], self.alone_rows.get(group, 0.0))

    def describe(self) -> str:
        rows = f" (per-token scales: {', '.join(self.row_scaled)})" if self.row_scaled else ""
        if not self.kept_fp32:
            return f"every product int8{rows}, {self.bits}-bit weights (min token cosine {self.min_cosine:.6f})"
        kept = ", ".join(f"{g} ({self.score(g):.6f} alone)" for g in self.kept_fp32)
        return (f"int8 ({self.bits}-bit weights) {', '.join(self.quantized)}{rows}; kept in fp32: {kept}, "
                f"as every product int8 gives {self.all_quantized:.6f} < {self.target}")


# The share of the text allowance (1 - target) a plan may spend on its sample: a sample's min token
# cosine is the min over its tokens, and text the plan never saw has other tokens, so the plan keeps
# the other half in hand (measured: planned to the whole allowance on 256 rows, a fine-tuned model
# gave 0.998944 on held-out speeches for a target of 0.999; bench/bench_int8_models.py).
PLAN_SHARE = 0.5


def plan_target(target: float) -> float:
    """What a plan holds its sample to, for a validation ``target``."""
    return 1.0 - PLAN_SHARE * (1.0 - target)


Measure = Callable[[Path], float]  # an int8 graph -> its score (export.onnx_export.int8_score): the min token
# cosine on the calibration sample, lower where the random-token shapes near their floor


def plan_int8(src: Path, dst: Path, target: float, measure: Measure, bits: int = 7) -> Int8Plan:
    """Quantize ``src`` into ``dst`` with ``bits`` weights: every group if that keeps ``measure`` >=
    ``target``, else each group measured alone (the main graph's also with per-token scales), then
    added from the least error alone per multiply-add to the most (``Int8Plan.order``) while the whole
    stays >= ``target``: as it is where that holds, else with per-token scales (they cost a pass over
    the product's output). Raises ParityError when no group can be quantized."""
    proto = onnx.load(str(src), load_external_data=False)
    groups, scalable = list(matmul_groups(proto)), row_scalable(proto)
    plan = Int8Plan(target, bits)
    quantize_int8(src, dst, bits=bits)
    plan.all_quantized = plan.min_cosine = measure(dst)
    if plan.all_quantized >= target:
        plan.quantized = groups
        return plan
    for g in groups:
        others = [k for k in groups if k != g]
        plan.alone[g] = _quantized(src, dst, measure, bits, others)
        if g in scalable:
            plan.alone_rows[g] = _quantized(src, dst, measure, bits, others, [g])
    for g in plan.order(group_values(proto)):
        _add_group(plan, g, groups, lambda keep, rows: _quantized(src, dst, measure, bits, keep, rows))
    plan.kept_fp32 = [g for g in groups if g not in plan.quantized]
    if not plan.quantized:
        best = max(groups, key=plan.score)
        raise ParityError(f"int8 does not validate for this model: each product group quantized alone drops the min "
                          f"token cosine below {target} (the best, {best}, gives {plan.score(best):.6f})")
    quantize_int8(src, dst, plan.kept_fp32, bits, plan.row_scaled)
    return plan


def _add_group(plan: Int8Plan, group: str, groups: list[str], score: Callable[[list[str], list[str]], float]) -> None:
    """Add ``group`` to ``plan``'s int8 groups where the whole (``score(keep_fp32, row_scaled)``) then
    holds the target: as it is, else with per-token scales; a variant failing alone is not tried."""
    keep = [k for k in groups if k not in plan.quantized and k != group]
    for rows in ([], [group]):
        alone = plan.alone_rows.get(group, 0.0) if rows else plan.alone[group]
        if alone < plan.target:
            continue
        cosine = score(keep, plan.row_scaled + rows)
        if cosine >= plan.target:
            plan.quantized.append(group)
            plan.row_scaled += rows
            plan.min_cosine = cosine
            return


def _quantized(src: Path, dst: Path, measure: Measure, bits: int, keep_fp32: Sequence[str],
               row_scaled: Sequence[str] = ()) -> float:
    quantize_int8(src, dst, keep_fp32, bits, row_scaled)
    return measure(dst)
