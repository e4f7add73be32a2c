"""The TensorRT backend: runs an `elmo export tensorrt` engine (optional `tensorrt` extra, GPU only).

The engine is refused (EngineMismatchError) when its manifest names another TensorRT version or
GPU. Device buffers are allocated for the largest shape seen so far and reused; each call sets the
input shape, binds addresses and runs ``execute_async_v3`` on the backend's CUDA stream.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from elmo_core import ElmoConfig
from elmo_core.errors import InputError

from .backends import BackendBase
from .errors import ExportError
from formats.export_manifest import check_file, read_spec
from .onnx_backend import check_char_ids
from .tensorrt_runtime import check_engine_manifest, cuda_check, gpu_identity, import_cudart, import_tensorrt


class _DeviceBuffer:
    """A growable device allocation, reused across calls."""

    def __init__(self, cudart) -> None:  # type: ignore[no-untyped-def]
        self.cudart, self.ptr, self.nbytes = cudart, 0, 0

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.free()
            self.ptr = cuda_check(self.cudart.cudaMalloc(max(nbytes, 256)), "cudaMalloc")
            self.nbytes = nbytes
        return int(self.ptr)

    def free(self) -> None:
        if self.ptr:
            cuda_check(self.cudart.cudaFree(self.ptr), "cudaFree")
            self.ptr, self.nbytes = 0, 0


class TensorRTBackend(BackendBase):
    """Shape: run(char_ids (B, T, C) int32) -> layers (B, L+1, T, 2P) float32, mask (B, T) bool."""

    name = "tensorrt"

    def __init__(self, engine_dir: str | Path) -> None:
        trt, self.cudart = import_tensorrt(), import_cudart()
        self.engine_dir = self.artifact_dir = Path(engine_dir)
        self.manifest, self.spec = read_spec(self.engine_dir, "tensorrt")
        check_engine_manifest(self.manifest, trt.__version__, gpu_identity())
        path = check_file(self.engine_dir, self.manifest["engine"])
        self.config = ElmoConfig.from_dict(self.manifest["source"]["architecture"], "manifest architecture")
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ExportError(f"{path}: TensorRT could not deserialize the engine; rebuild it")
        self.context = self.engine.create_execution_context()
        self.stream = cuda_check(self.cudart.cudaStreamCreate(), "cudaStreamCreate")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.buffers = {n: _DeviceBuffer(self.cudart) for n in names}
        self.max_bt = tuple(self.manifest["profile"][self.spec.inputs[0].name]["max"][:2])

    def _copy(self, dst: int | np.ndarray, src: int | np.ndarray, nbytes: int, kind) -> None:  # type: ignore[no-untyped-def]
        d = dst.ctypes.data if isinstance(dst, np.ndarray) else dst
        s = src.ctypes.data if isinstance(src, np.ndarray) else src
        cuda_check(self.cudart.cudaMemcpyAsync(d, s, nbytes, kind, self.stream), "cudaMemcpyAsync")

    def _execute(self, ids: np.ndarray) -> list[np.ndarray]:
        B, T, _ = ids.shape
        if B > self.max_bt[0] or T > self.max_bt[1]:
            raise InputError(f"batch {B} x length {T} exceeds the engine's profile max {self.max_bt}; "
                             f"use a smaller batch_size or rebuild with a larger --max")
        name_in = self.spec.inputs[0].name
        self.context.set_input_shape(name_in, ids.shape)
        self._copy(self.buffers[name_in].ensure(ids.nbytes), ids, ids.nbytes,
                   self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)
        self.context.set_tensor_address(name_in, self.buffers[name_in].ptr)
        outs = []
        for t in self.spec.outputs:
            host = np.empty(tuple(self.context.get_tensor_shape(t.name)), self.dtypes[t.name])
            self.context.set_tensor_address(t.name, self.buffers[t.name].ensure(host.nbytes))
            outs.append(host)
        if not self.context.execute_async_v3(self.stream):
            raise ExportError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        for t, host in zip(self.spec.outputs, outs):
            self._copy(host, self.buffers[t.name].ptr, host.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        cuda_check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        return outs

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.spec.mode.layer_axis:
            raise ExportError(f"{self.engine_dir} was built from a --output mixed export; use run_mixed()")
        out, mask = self._execute(check_char_ids(char_ids, self.spec.max_chars))
        return out.astype(np.float32, copy=False), mask.astype(bool, copy=False)

    def run_mixed(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shape: (B, T, C) -> mixed (B, T, 2P), mask (B, T)."""
        if not self.spec.mode.mixes:
            raise ExportError(f"{self.engine_dir} was built from a --output all export; use run()")
        out, mask = self._execute(check_char_ids(char_ids, self.spec.max_chars))
        return out.astype(np.float32, copy=False), mask.astype(bool, copy=False)

    def close(self) -> None:
        for buf in getattr(self, "buffers", {}).values():
            buf.free()
        if getattr(self, "stream", None) is not None:
            cuda_check(self.cudart.cudaStreamDestroy(self.stream), "cudaStreamDestroy")
            self.stream = None
