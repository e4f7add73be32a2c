"""The ONNX Runtime backend: runs an `elmo export onnx` directory.

Thread and graph-optimization settings are explicit; the optimized graph is cached beside the
export (keyed by the ONNX file's sha256, the ONNX Runtime version, the providers and the level)
so later sessions skip the optimization passes; with a GPU provider, inputs and outputs go through
IOBinding.
"""
from __future__ import annotations

import hashlib
import platform
from pathlib import Path
from typing import Sequence

import numpy as np

from elmo_core import ElmoConfig
from elmo_core.errors import InputError

from runtime import threads_for

from .backends import BackendBase
from elmo_core.vectors import VectorRequest
from .precision import cpu_model
from .errors import ExportError
from formats.export_manifest import check_file, read_spec
from storage.atomic import new_temporary

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider")
PROVIDER_HINTS = {
    "CUDAExecutionProvider": "it needs the `gpu` extra (onnxruntime-gpu), a CUDA GPU and its CUDA/cuDNN libraries",
    "TensorrtExecutionProvider": "it needs TensorRT's libraries (libnvinfer, the `tensorrt` extra) beside "
                                 "onnxruntime-gpu; without them use CUDAExecutionProvider",
}
OPT_LEVELS = ("disable", "basic", "extended", "all")
CACHE_DIR = ".ort_cache"


def check_char_ids(char_ids: np.ndarray, max_chars: int) -> np.ndarray:
    """Validate a batch of character ids as the torch backend does. Shape: (B, T, C) int32."""
    ids = np.ascontiguousarray(char_ids)
    if ids.ndim != 3 or ids.shape[2] != max_chars:
        raise InputError(f"character ids must have shape (batch, time, {max_chars}), got {ids.shape}")
    if ids.dtype != np.int32:
        raise InputError(f"character ids must be int32, got {ids.dtype}")
    mask = (ids > 0).any(-1)  # (B, T)
    if not np.array_equal(mask, np.arange(ids.shape[1])[None, :] < mask.sum(1)[:, None]):
        raise InputError("character ids must be left-aligned: padding tokens only after a row's last token")
    return ids


# Our defaults for the CUDA provider; options a caller passes win. Measured on an H100, full size:
# use_tf32 0: fp32 MatMuls in fp32. ONNX Runtime's default TF32 put a fp32 export 1.3e-3 from torch
#   on the fixture model (beyond the 1e-3 GPU tolerance); ("CUDAExecutionProvider", {"use_tf32": 1})
#   opts in (a few % faster).
# cudnn_conv_algo_search DEFAULT: the default EXHAUSTIVE search runs again for every new batch shape
#   (each batch has its own length), which made the char-CNN 70 % of the time (14k tokens/s at
#   batch 64, 34k with DEFAULT), and at batch 256 and 512 it asked for 111 and 221 GB of workspace
#   and failed; with DEFAULT they ran at 47k and 54k tokens/s.
# cudnn_conv_use_max_workspace 0: the workspace capped at ONNX Runtime's 32 MB.
CUDA_DEFAULTS = {"use_tf32": 0, "cudnn_conv_algo_search": "DEFAULT", "cudnn_conv_use_max_workspace": 0}


def cuda_provider_status() -> tuple[bool, str]:
    """(present, reason): this ONNX Runtime has the CUDA provider (whether a GPU answers shows at load)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return True, f"onnxruntime {ort.__version__} has CUDAExecutionProvider"
    return False, (f"onnxruntime {ort.__version__} has no CUDAExecutionProvider; "
                   f"install the `gpu` extra (onnxruntime-gpu)")


def _with_defaults(provider):  # type: ignore[no-untyped-def]
    """A provider name or (name, options) pair, with our defaults filled in for CUDA."""
    name, options = provider if isinstance(provider, tuple) else (provider, {})
    return (name, {**CUDA_DEFAULTS, **options}) if name == "CUDAExecutionProvider" else provider


def _level(name: str):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if name not in levels:
        raise InputError(f"graph optimization must be one of {OPT_LEVELS}, got {name!r}")
    return levels[name]


def session_options(threads: int | None = None):  # type: ignore[no-untyped-def]
    """ONNX Runtime's session options for a run on ``threads`` threads (None: the CPUs this process
    is given, ``runtime.cpus``): intra-op that count, inter-op one, nodes run in sequence, idle
    workers asleep instead of spinning."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads_for(threads).count
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle workers sleep (runtime.cpus)
    return so


class OnnxBackend(BackendBase):
    """An exported biLM on ONNX Runtime.

    Shape: run(char_ids (B, T, C) int32) -> layers (B, L+1, T, 2P) float32, mask (B, T) bool.
    A ``--output mixed`` export gives ``run_mixed`` -> (B, T, 2P) instead.
    """

    name = "onnx"

    def __init__(self, export_dir: str | Path, providers: Sequence[str] | None = None, threads: int | None = None,
                 optimization: str = "all", cache: bool = True) -> None:
        import onnxruntime as ort

        self.export_dir = self.artifact_dir = Path(export_dir)
        self.manifest, self.spec = read_spec(self.export_dir, "onnx")
        self.config = ElmoConfig.from_dict(self.manifest["source"]["architecture"], "manifest architecture")
        path = check_file(self.export_dir, self.manifest["onnx"])
        self.providers = [_with_defaults(p) for p in providers or ["CPUExecutionProvider"]]  # (name, options) or names
        names = [p[0] if isinstance(p, tuple) else p for p in self.providers]
        missing = [p for p in names if p not in ort.get_available_providers()]
        if missing:
            raise ExportError(f"ONNX Runtime providers {missing} are not available here "
                              f"(available: {ort.get_available_providers()}); install the `gpu` extra for CUDA")
        if any(n in GPU_PROVIDERS for n in names):
            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* wheels, as onnxruntime-gpu documents
            # The CUDA Conv warns "running in Fallback mode" through the process-wide logger for every
            # new shape under the DEFAULT algorithm search (fast here; see CUDA_DEFAULTS); errors still show.
            ort.set_default_logger_severity(3)
        so = session_options(threads)
        so.log_severity_level = 3  # the cache is keyed by CPU model, so ORT's "hardware specific" warning is moot
        self._cache_pending: tuple[Path, Path] | None = None
        self.optimized_path, so.graph_optimization_level = self._cache(path, optimization, cache, so)
        try:
            self.session = ort.InferenceSession(str(self.optimized_path or path), so, providers=self.providers)
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise ExportError(f"{path}: ONNX Runtime cannot load it with {self.providers} ({str(e)[:300]})") from None
        active = self.session.get_providers()
        if names[0] not in active:  # ORT falls back to the next provider when one fails to load
            raise ExportError(f"ONNX Runtime could not enable {names[0]} (it runs {active}); "
                              f"{PROVIDER_HINTS.get(names[0], 'see its log above')}")
        if self._cache_pending is not None and self._cache_pending[0].is_file():
            self._cache_pending[0].replace(self._cache_pending[1])
        self.use_iobinding = any(p in GPU_PROVIDERS for p in active)
        self.device_id = int(self.session.get_provider_options().get(active[0], {}).get("device_id", 0) or 0)
        self.threads = threads
        self.output_names = [t.name for t in self.spec.outputs]

    def _cache(self, path: Path, optimization: str, cache: bool, so):  # type: ignore[no-untyped-def]
        """(cached optimized model or None, the level to load with); writes the cache on a miss."""
        import onnxruntime as ort

        level = _level(optimization)
        if not cache or optimization == "disable":
            return None, level
        machine = f"{platform.machine()}|{cpu_model()}"  # level 'all' may emit layouts for this CPU
        key = hashlib.sha256(f"{self.manifest['onnx']['sha256']}|{ort.__version__}|{self.providers}|{optimization}|"
                             f"{machine}".encode()).hexdigest()[:16]
        cached = self.export_dir / CACHE_DIR / f"model.{optimization}.{key}.onnx"
        if cached.is_file():  # already optimized for this ONNX Runtime and these providers
            return cached, ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            cached.parent.mkdir(exist_ok=True)
        except OSError:  # read-only export directory: optimize in memory every time
            return None, level
        self._cache_pending = (new_temporary(cached), cached)
        so.optimized_model_filepath = str(self._cache_pending[0])  # renamed once the session exists
        return None, level

    @property
    def output(self) -> str:
        return self.spec.vectors.output

    def _run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = check_char_ids(char_ids, self.spec.max_chars)
        try:
            return self._session_run(ids)
        except Exception as e:  # onnxruntime raises its own untyped errors (out of memory, say)
            raise ExportError(f"{self.export_dir}: ONNX Runtime failed on a batch of {ids.shape[0]} x {ids.shape[1]} "
                              f"tokens ({self.session.get_providers()[0]}): {str(e)[-300:]}; a smaller batch_size "
                              f"needs less memory") from None

    def _session_run(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        feed_name = self.spec.inputs[0].name
        if not self.use_iobinding:
            out, mask = self.session.run(self.output_names, {feed_name: ids})
            return out, mask
        binding = self.session.io_binding()
        binding.bind_cpu_input(feed_name, ids)
        for name in self.output_names:
            binding.bind_output(name, "cuda", self.device_id)
        self.session.run_with_iobinding(binding)
        out, mask = binding.copy_outputs_to_cpu()
        return out, mask

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.spec.mode.layer_axis:
            raise ExportError(f"{self.export_dir} was exported with --output {self.spec.vectors.output}: it has no layers; "
                              f"use run_mixed(), or export with --output all for the Embedder")
        return self._run(char_ids)

    def check_request(self, request: VectorRequest) -> None:
        """A ``--output mixed`` export computes one weighting of the layers: the request must be it."""
        super().check_request(request)
        if not self.spec.mode.layer_axis and not self._is_baked(request.weights(self.config.n_output_layers)):
            raise InputError(f"{self.export_dir} was exported with --output mixed (layer weights "
                             f"{np.round(self.spec.normalized_mix(), 6).tolist()}); it cannot give --output "
                             f"{request.output}{' with layer norm' if request.layer_norm else ''} with these "
                             f"weights: ask for its mix (--mix, --gamma as exported), or use an --output all export")

    def _is_baked(self, weights: np.ndarray | None) -> bool:
        return weights is not None and np.allclose(weights, self.spec.normalized_mix(), rtol=0, atol=1e-9)

    def run_combined(self, char_ids: np.ndarray, weights: np.ndarray,
                     dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """A mixed export runs its own mix (``weights`` must be it); an all-layers export combines here."""
        if self.spec.mode.layer_axis:
            return super().run_combined(char_ids, weights, dtype)
        if not self._is_baked(weights):
            raise InputError(f"{self.export_dir}: a mixed export computes layer weights "
                             f"{np.round(self.spec.normalized_mix(), 6).tolist()}, not {np.round(weights, 6).tolist()}")
        mixed, mask = self.run_mixed(char_ids)  # (B, T, 2P)
        return mixed.astype(dtype, copy=False), mask

    def run_mixed(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shape: (B, T, C) -> mixed (B, T, 2P), mask (B, T); only for --output mixed exports."""
        if not self.spec.mode.mixes:
            raise ExportError(f"{self.export_dir} was exported with --output all; use run()")
        return self._run(char_ids)

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]
