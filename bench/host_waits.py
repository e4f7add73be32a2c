"""Host waits, counted on any machine: the operations that make the host wait for a CUDA device,
counted while code runs on the CPU (``python bench/bench_gpu.py --proxy``; tests/inference/test_host_waits.py).

On CUDA the host queues work and goes on; it waits where it needs a value the device computes:
- a scalar read (``.item()``, ``int()`` / ``bool()`` of a tensor: ``aten._local_scalar_dense``)
  and a comparison of whole tensors (``aten.equal``);
- an operation whose output size depends on the data (``nonzero``, ``masked_select``, ``unique``,
  indexing or assigning with a boolean mask, ``repeat_interleave`` by a tensor of counts);
- a copy to the host (``.cpu()``, ``.numpy()``, ``.tolist()`` of a tensor computed on the device),
  and a copy to the device from pageable memory.
A dispatch mode sees the first two kinds as aten operations; the third as the tensor methods
that copy (wrapped while counting: on a CPU they are no-ops the dispatcher never sees). What runs
on the CPU is the CUDA code path itself (the rows layout, its windows run eagerly), and only
operations on the device's tensors count (``HostWaits`` follows which those are), so each count
is the device's. A copy to the device (``Tensor.to``) counts unless it is ``non_blocking`` from
pinned memory (on the CPU that stands in for CUDA: ``non_blocking``); so does a tensor made on a
device from Python data (``torch.tensor`` / ``torch.as_tensor`` with a ``device``: a pageable copy).
"""
from __future__ import annotations

import collections
import json
import contextlib
import weakref
from typing import Iterator

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SCALAR = {aten._local_scalar_dense, aten.equal, aten.is_nonzero}
DATA_SIZED = {aten.nonzero, aten.masked_select, aten._unique2, aten.unique_consecutive, aten.unique_dim,
              aten.repeat_interleave}
COPIES = ("cpu", "numpy", "tolist")
FROM_DATA = ("tensor", "as_tensor")


class HostWaits(TorchDispatchMode):
    """``with HostWaits(device_tensors) as w:`` ... ``w.total``, ``w.by_kind`` (what waited, by name).

    Which tensors are the device's is followed as the code runs: those given (the model's
    parameters), what ``Tensor.to(device)`` returns, and every output of an operation on one of
    them; the rest are the host's (built from Python lists or numpy arrays, as a batch's plan is),
    whose reads cost no wait. ``counting`` off: follow without counting (a warm-up)."""

    def __init__(self, device_tensors=()) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.device = _TensorSet(device_tensors)
        self.counting = True
        self._stack = contextlib.ExitStack()

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def count(self, kind: str) -> None:
        if self.counting:
            self.by_kind[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        packet = func.overloadpacket
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = any(t in self.device for t in inputs)
        if on_device and (packet in SCALAR or packet in DATA_SIZED or _bool_index(packet, args)):
            self.count(packet.__name__)
        out = func(*args, **(kwargs or {}))
        if on_device:
            for t in pytree.tree_leaves(out) + (inputs if func._schema.is_mutable else []):
                if isinstance(t, torch.Tensor):
                    self.device.add(t)
        return out

    def __enter__(self) -> "HostWaits":
        super().__enter__()
        for name in COPIES:
            self._stack.enter_context(_counting(self, name))
        self._stack.enter_context(_counting_to(self))
        for name in FROM_DATA:
            self._stack.enter_context(_counting_made(self, name))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        super().__exit__(*exc)


class _TensorSet:
    """Tensors by identity (a tensor's ``==`` is element-wise), forgotten as they are freed."""

    def __init__(self, tensors=()) -> None:  # type: ignore[no-untyped-def]
        self.refs: dict[int, weakref.ref] = {}
        for t in tensors:
            self.add(t)

    def add(self, t: torch.Tensor) -> None:
        key = id(t)
        self.refs[key] = weakref.ref(t, lambda _, key=key: self.refs.pop(key, None))

    def discard(self, t: torch.Tensor) -> None:
        self.refs.pop(id(t), None)

    def __contains__(self, t: object) -> bool:
        ref = self.refs.get(id(t))
        return ref is not None and ref() is t


def _bool_index(packet, args) -> bool:  # type: ignore[no-untyped-def]
    """Indexing (or assigning) with a boolean mask: its size is the mask's count of True."""
    if packet not in (aten.index, aten.index_put, aten.index_put_):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


@contextlib.contextmanager
def _counting(waits: HostWaits, name: str) -> Iterator[None]:
    """A copy of a device tensor to the host."""
    original = getattr(torch.Tensor, name)

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self in waits.device:
            waits.count(f"Tensor.{name}")
        out = original(self, *args, **kwargs)
        if name == "cpu":  # on the host now (on a CPU: the same tensor)
            waits.device.discard(out)
        return out
    setattr(torch.Tensor, name, counted)
    try:
        yield
    finally:
        setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def _counting_to(waits: HostWaits) -> Iterator[None]:
    """``Tensor.to(device)``: its result is the device's; from a host tensor that is not pinned, or
    without ``non_blocking``, the host waits for the copy."""
    original = torch.Tensor.to

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        target = next((a for a in args if isinstance(a, (str, torch.device))), kwargs.get("device"))
        out = original(self, *args, **kwargs)
        if out is self and target is not None:  # on the CPU the same tensor: on the device it is another
            out = self.view_as(self)
        if target is not None and self not in waits.device:
            non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args)
            if not (non_blocking and (self.is_pinned() or torch.device(target).type == "cpu")):
                waits.count("copy to the device from pageable memory")
            waits.device.add(out)
        return out
    torch.Tensor.to = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.to = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _counting_made(waits: HostWaits, name: str) -> Iterator[None]:
    """``torch.tensor(data, device=...)``: Python data copied to the device from pageable memory."""
    original = getattr(torch, name)

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(*args, **kwargs)
        if kwargs.get("device") is not None:
            waits.count("copy to the device from pageable memory")
            waits.device.add(out)
        return out
    setattr(torch, name, counted)
    try:
        yield
    finally:
        setattr(torch, name, original)


def cuda_path_backend(model, token_cache: int = 50_000):  # type: ignore[no-untyped-def]
    """A ``TorchBackend`` on the CPU running what CUDA runs: the rows layout (its windows eager),
    fused steps, both directions on the calling thread (a dispatch mode sees that thread only), the
    token cache (``token_cache`` tokens; 0: none)."""
    import inspect

    from inference.backends import TorchBackend
    from inference.fast_path import FastInference

    backend = TorchBackend(model, token_cache=token_cache)
    one_thread = {"directions": False} if "directions" in inspect.signature(FastInference).parameters else {}
    backend.fast = FastInference(backend.model, "fp32", backend.fast.token_cache, cuda_graphs=True, capture=False,
                                 **one_thread)
    backend.model.use_fast_path(backend.fast)
    return backend


def batch_waits(backend, sentences: list[list[str]]) -> HostWaits:  # type: ignore[no-untyped-def]
    """The host waits of one model batch of ``elmo embed`` (tokens prepared, run, mixed, in float16,
    placed in the output), after a first batch has warmed the cache and the kernels as a job's
    first batches do."""
    from inference import engine
    from inference.batching import BatchPolicy

    try:
        from elmo_core.vectors import VectorRequest
    except ImportError:  # a tree from before the record had its home in elmo_core (647018a: inference.outputs)
        from inference.outputs import VectorRequest

    policy, request = BatchPolicy(max_tokens_per_batch=1 << 20), VectorRequest("mixed", dtype="float16")
    held = [*backend.model.parameters(), *backend.model.buffers()]
    with torch.inference_mode(), HostWaits(held) as waits:
        waits.counting = False
        engine.run(backend, engine.prepare(backend, sentences, policy), request)
        waits.counting = True
        prepared = engine.prepare(backend, sentences, policy)
        assert len(prepared.plan.batches) == 1
        engine.run(backend, prepared, request)
    return waits


COUNT_BATCH = """
import json, sys
sys.path.insert(0, sys.argv[2])
from host_waits import batch_waits, cuda_path_backend
from elmo_core import BiLM, ElmoConfig
from elmo_core.init import init_bilm
from bench.bench_bilm import bench_sentences
model = init_bilm(BiLM(ElmoConfig.from_dict(json.loads(sys.argv[1]))), seed=0).eval()
waits = batch_waits(cuda_path_backend(model), bench_sentences(64))
print(json.dumps(dict(waits.by_kind)))
"""


def count_in_tree(tree, options: dict) -> dict:  # type: ignore[no-untyped-def]
    """``batch_waits`` of ``tree``'s code (a checkout: the tree before), counted by this module."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parent)
    r = subprocess.run([sys.executable, "-c", COUNT_BATCH, json.dumps(options), bench], cwd=tree, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{bench}"})
    if r.returncode != 0:
        raise RuntimeError(f"counting the host waits in {tree} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

