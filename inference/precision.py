"""Inference precision of the matrix products: fp32, tf32 (CUDA), bf16, fp16.

Only the matrix products change. In bf16 / fp16 the LSTM's products (input, recurrent, projection)
take inputs rounded to that type, from weight copies made once, and their results come back in
fp32; the cell state, the gate nonlinearities, both clips, the residual sums and the mix stay in
fp32. The char-CNN (convolutions, highway, projection) runs under ``torch.autocast`` in that type
and its output is fp32. tf32 keeps every tensor fp32 and lets the GPU's tensor cores round the
products' inputs to tf32 (CUDA only: a CPU has no tf32 mode).

Parity (issue's rule, tested): fp32 on a GPU within 1e-3 of the CPU; tf32, bf16 and fp16 every
token's cosine >= 0.999 against CPU fp32, every layer.
"""
from __future__ import annotations

import contextlib
import functools
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from elmo_core.errors import InputError
from elmo_core.kinds import Precision
from elmo_core.names import PRECISIONS


def torch_precision(precision: str | Precision) -> Precision:
    """The record of a precision the torch backend runs; InputError for any other name."""
    kind = Precision.ALL.get(precision) if isinstance(precision, str) else precision
    if kind is None or not kind.torch_backend:
        name = precision if isinstance(precision, str) else precision.name
        raise InputError(f"precision must be one of {list(PRECISIONS)}, got {name!r}")
    return kind


def check_precision(precision: str | Precision, device: str | torch.device) -> Precision:
    """The torch backend's precision on ``device``, checked: InputError for an unknown one, or tf32
    off CUDA. What runs downstream takes the record this returns and checks nothing again."""
    kind = torch_precision(precision)
    if kind.gpu_rounds and torch.device(device).type != "cuda":
        raise InputError(f"precision {kind.name} is a CUDA tensor-core mode; on {device} use fp32 (or bf16 / fp16)")
    return kind


# What /proc/cpuinfo calls the instructions that multiply bf16 in hardware (Intel AMX on Sapphire
# Rapids and later; AVX512-BF16 on Cooper Lake, Zen 4 and Zen 5). Without them oneDNN emulates
# bf16 products with fp32 ones plus conversions.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
# bf16 GEMM speed against fp32 where emulated with AVX-512: oneDNN limited to AVX-512 without BF16
# (ONEDNN_MAX_CPU_ISA=AVX512_CORE) on a Sapphire Rapids, 160 x 512 x 16384: 66 vs 292 GFLOP/s.
BF16_EMULATED_SLOWDOWN = "about 0.2x"
# Without AVX-512 torch multiplies bf16 and fp16 in scalar code: the same product on 2 cores of an
# AVX2-only AMD EPYC, 0.31 GFLOP/s in bf16 and in fp16 against 79 in fp32 (0.004x).
AVX2_LOW_PRECISION_SLOWDOWN = "0.004x (0.31 against 79 GFLOP/s measured on an AVX2-only AMD EPYC)"


# What /proc/cpuinfo calls the instructions that multiply int8 in hardware: AMX-INT8 (Sapphire
# Rapids and later), AVX512-VNNI (Cascade Lake, Ice Lake, Zen 4, Zen 5), AVX-VNNI (Alder Lake and
# later client cores). Without them ONNX Runtime's int8 kernels multiply with AVX2 (vpmaddubsw).
INT8_CPU_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


@functools.lru_cache(maxsize=None)
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The instruction-set flags this CPU reports: x86's ``flags``, Arm's ``Features`` (empty where
    /proc/cpuinfo is absent); read once."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass  # not Linux: nothing reported, so nothing assumed
    return frozenset()


def worker_cpu_flags(_: object = None) -> frozenset[str]:
    """``cpu_flags`` as a task a cluster's worker runs (Spark's ``map`` hands it an item): the flags
    of the CPU the model runs on, where that is not the driver's."""
    return cpu_flags()


@dataclass(frozen=True)
class CpuBf16:
    """What a CPU does with bf16 products: ``hardware``, the instruction that multiplies them (one
    of ``BF16_CPU_FLAGS``; None: none, oneDNN emulates them with AVX-512); ``avx512``: it has
    AVX-512; ``onednn``: oneDNN's bf16 kernels on packed weights run on it (torch's own report)."""

    hardware: str | None
    avx512: bool
    onednn: bool

    @property
    def scalar(self) -> bool:
        """Neither AVX-512 nor a bf16 instruction: torch multiplies bf16 and fp16 in scalar code."""
        return self.hardware is None and not self.avx512


@functools.lru_cache(maxsize=None)
def cpu_bf16(flags: frozenset[str] | None = None) -> CpuBf16:
    """The one judge of what this CPU (or one reporting ``flags``) does with bf16; judged once."""
    flags = cpu_flags() if flags is None else flags
    found = [f for f in BF16_CPU_FLAGS if f in flags]
    return CpuBf16(found[0] if found else None, "avx512f" in flags,
                   bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()))


# What ``--precision auto`` measures for the onnx backend on a model directory, fastest first where
# the CPU has int8 instructions: int8 (planned per model, ``export.quantize``) and fp32. fp16 is not
# a candidate: ONNX Runtime's CPU provider has no fp16 products on x86 (casts around fp32 ones,
# measured 0.64x fp32 at full size); bf16 cannot run on it.
ONNX_AUTO_CANDIDATES = ("int8", "fp32")


@dataclass(frozen=True)
class MeasuredPrecision:
    """One candidate of ``--precision auto`` as measured on this model and CPU: its min token cosine
    against torch fp32 on text (None: it did not validate, ``failure`` says why) and its speed."""

    precision: str
    min_cosine: float | None
    tokens_per_s: float | None = None
    failure: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"precision": self.precision, "min_cosine": self.min_cosine, "tokens_per_s": self.tokens_per_s,
                "failure": self.failure}


# The instruction sets the kernels a CPU gets are chosen by (oneDNN, MKL, ONNX Runtime, inductor): part
# of ``cpu_model``, so that what is measured or compiled for one CPU is not read on another (x86's
# and Arm's names).
KERNEL_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_bf16", "amx_int8",
                    "asimddp", "sve", "sve2", "bf16", "i8mm")
# The fields that tell two CPUs of one name apart: x86's family, model and stepping; Arm's part and variant.
_CPU_NUMBERS = (("cpu family", "family"), ("model", "model"), ("stepping", "stepping"),
                ("CPU implementer", "implementer"), ("CPU part", "part"), ("CPU variant", "variant"))


@functools.lru_cache(maxsize=None)
def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This CPU as the caches of what is measured or compiled per CPU name it (layouts, ONNX Runtime's
    optimized models, ``--precision auto``'s measurements): its model name, its numbers
    (``_CPU_NUMBERS``) and which of ``KERNEL_CPU_FLAGS`` it has, e.g. ``AMD EPYC (family 26 model 2
    stepping 1; avx2 avx512f avx512_vnni avx512_bf16 avx_vnni)``. The name alone is not enough: a
    VM may call every generation "AMD EPYC", from AVX2 only to AVX512-BF16, and Arm's cpuinfo has
    none. ``platform.processor()`` where /proc/cpuinfo is absent; read once."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        return platform.processor()
    numbers = " ".join(f"{name} {fields[key]}" for key, name in _CPU_NUMBERS if key in fields)
    flags = cpu_flags(cpuinfo)
    isa = " ".join(f for f in KERNEL_CPU_FLAGS if f in flags) or "none of the kernel flags"
    return f"{fields.get('model name') or platform.machine()} ({numbers}; {isa})"


# --precision auto on a CPU with bf16 units, for a model whose products are too small for packed
# oneDNN weights: bf16 runs on weight copies there, slower than fp32 (models/default, 2 cores of an
# AMX Xeon: 0.61x packed, 0.75x fused; docs/performance.md).
SMALL_BF16 = ("this model's products are too small for the CPU's bf16 units to pay (the shipped model's bf16 "
              "measured 0.61-0.75x fp32 on an AMX Xeon)")


def resolve_precision(precision: str, device: str, flags: frozenset[str] | None = None,
                      packed: bool = True) -> tuple[str, str]:
    """The torch backend's ``--precision auto`` made concrete, and why: the fastest precision within
    the parity bound (every token's cosine >= 0.999 against fp32, tested) that this device multiplies
    in hardware; ``packed``: the model's products run on packed oneDNN weights on a CPU
    (``fast_lstm.packed_products``), without which a CPU's bf16 units do not pay. Any other precision
    is returned as asked. (The onnx backend measures its own on a model directory: ``export.auto``,
    ``fastest_validated``.)"""
    if precision != "auto":
        return precision, "asked for"
    if device.startswith("cuda"):
        return "bf16", "CUDA: bf16 products on the tensor cores (H100: 1.4x fp32, min token cosine 0.99999)"
    found = cpu_bf16(flags).hardware
    if found and not packed:
        return "fp32", SMALL_BF16
    if found:
        return "bf16", f"this CPU multiplies bf16 in hardware ({found})"
    return "fp32", f"this CPU has no bf16 instructions ({' / '.join(BF16_CPU_FLAGS)})"


def fastest_validated(measured: Sequence[MeasuredPrecision]) -> tuple[str, str]:
    """The fastest measured precision that validated, and why (every candidate's figures)."""
    valid = [m for m in measured if m.min_cosine is not None and m.tokens_per_s is not None]
    if not valid:
        raise InputError("no precision validates for this model: " + "; ".join(m.failure for m in measured))
    best = max(valid, key=lambda m: m.tokens_per_s or 0.0)

    def figures(m: MeasuredPrecision) -> str:
        if m.min_cosine is None:
            return f"{m.precision} does not validate"
        return f"{m.precision} {m.tokens_per_s:,.0f} tokens/s at min token cosine {m.min_cosine:.6f}"
    return best.precision, ("the fastest precision that validates for this model on this CPU: "
                            + ", ".join(figures(m) for m in measured))


@dataclass(frozen=True)
class SlowPrecision:
    """Why a precision runs below fp32's speed on this CPU; ``scalar``: far below (scalar products),
    which a command refuses (a library caller may still run it: the vectors are right)."""

    text: str
    scalar: bool


def bf16_cpu_warning(precision: str, device: str, flags: frozenset[str] | None = None) -> SlowPrecision | None:
    """bf16 on a CPU that emulates it with AVX-512; bf16 or fp16 on a CPU without AVX-512, where
    torch multiplies them in scalar code (``scalar``); else None."""
    kind = Precision.ALL.get(precision)
    if kind is None or not kind.reduced or not device.startswith("cpu"):
        return None
    cpu = cpu_bf16(flags)
    if cpu.scalar:
        return SlowPrecision(f"--precision {precision} on a CPU without AVX-512: torch multiplies {precision} in "
                             f"scalar code here, {AVX2_LOW_PRECISION_SLOWDOWN} fp32's speed; use fp32 (or "
                             f"--precision auto), or --backend onnx --precision int8 for a faster CPU path", True)
    if precision != "bf16" or cpu.hardware:
        return None
    return SlowPrecision(f"--precision bf16 on a CPU without bf16 instructions ({' / '.join(BF16_CPU_FLAGS)}): its "
                         f"products are emulated, {BF16_EMULATED_SLOWDOWN} fp32's speed measured; use fp32, or "
                         f"--precision auto", False)


def int8_cpu_report(flags: frozenset[str] | None = None) -> str:
    """Which int8 instructions ONNX Runtime's quantized products get on this CPU, in words."""
    found = [f for f in INT8_CPU_FLAGS if f in (cpu_flags() if flags is None else flags)]
    if found:
        return f"this CPU multiplies int8 in hardware ({', '.join(found)})"
    return f"this CPU has no int8 dot-product instructions ({' / '.join(INT8_CPU_FLAGS)}): AVX2 int8 kernels"


@contextlib.contextmanager
def tf32_products(enabled: bool) -> Iterator[None]:
    """CUDA products and convolutions in tf32 inside the block; the previous settings after it."""
    if not enabled:
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
