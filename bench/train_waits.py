"""Host waits per training step: the ops of ``Trainer``'s step that would make a CUDA host wait
for the device, counted by a dispatch mode while the step runs on the CPU.

A host wait is a read of device data on the host, or a copy to the device from pageable memory:

* scalar reads (``aten._local_scalar_dense``: ``.item()``, ``float(t)``, ``bool(t)``, ``if t:``);
* ``.cpu()``, ``.tolist()``, ``.numpy()`` of device data;
* ops whose output size depends on the data: ``nonzero``, ``masked_select``, ``unique``, boolean
  indexing (``t[mask]``, ``t[mask] = v``);
* ``aten.equal`` (``torch.equal``);
* copies to a device from pageable host memory: ``.to(device)`` / ``.cuda()`` without
  ``non_blocking`` (with CUDA present: from memory that is not pinned), ``torch.tensor(..., device=d)``.

On the CPU every tensor is "on the device", so the counter follows where data comes from: the
model's parameters, buffers and optimizer state are device data, so is what a copy to the device
gives and everything computed from device data. Host-side preparation (the batcher, the sampler's
draws on its CPU generator) reads only host data and is not counted, as on CUDA.

    python bench/train_waits.py                      # host waits per training step: base -> this tree
    python bench/train_waits.py --tree DIR [--steps 10]   # DIR's trainer only, by op
    TRAIN_WAITS_TRACE=1 python bench/train_waits.py --tree .   # and where each wait comes from
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import traceback
import sys
import tempfile
import weakref
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
BASE_COMMIT = "647018a"
READS = {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "unique", "_unique", "_unique2",
         "unique_consecutive", "unique_dim", "equal"}
HOST_METHODS = {"cpu", "tolist", "numpy"}


class _Tags:
    """Device data, by identity (weak: tensors that die leave)."""

    def __init__(self) -> None:
        self._ids: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def add(self, t: torch.Tensor) -> None:
        self._ids[id(t)] = t

    def discard(self, t: torch.Tensor) -> None:
        self._ids.pop(id(t), None)

    def has(self, t) -> bool:  # noqa: ANN001
        return isinstance(t, torch.Tensor) and self._ids.get(id(t)) is t

    def any(self, args) -> bool:  # noqa: ANN001
        return any(self.has(t) for t in tree_flatten(args)[0])


class _DeviceOps(TorchDispatchMode):
    def __init__(self, tags: _Tags, counts: dict) -> None:
        super().__init__()
        self.tags, self.counts = tags, counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        on_device = self.tags.any((args, kwargs))
        if on_device and (name in READS or _bool_index(name, args)):
            self.counts[name] = self.counts.get(name, 0) + 1
            _where(name)
        out = func(*args, **kwargs)
        if on_device:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.tags.add(t)
        return out


def _where(name: str) -> None:
    """With TRAIN_WAITS_TRACE=1, where each counted op came from (on stderr; TRAIN_WAITS_DEPTH frames)."""
    if os.environ.get("TRAIN_WAITS_TRACE"):
        frames = [f for f in traceback.extract_stack() if "train_waits" not in f.filename and (os.environ.get("TRAIN_WAITS_DEPTH") or "/torch/" not in f.filename)]
        print(name, " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-int(os.environ.get("TRAIN_WAITS_DEPTH", 3)):][::-1]), file=sys.stderr)


def _bool_index(name: str, args) -> bool:  # noqa: ANN001
    if name not in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))


class _HostCalls(TorchFunctionMode):
    def __init__(self, tags: _Tags, counts: dict, device: torch.device | None) -> None:
        super().__init__()
        self.tags, self.counts, self.device = tags, counts, device

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        if name in HOST_METHODS and args and self.tags.has(args[0]):
            self.counts[name] = self.counts.get(name, 0) + 1
            if isinstance(out, torch.Tensor):
                self.tags.discard(out)  # on the host now
            return out
        to_device = name == "cuda" or (name == "to" and _target(args, kwargs) is self.device)
        if to_device and _pageable_copy(args, kwargs) and not self.tags.has(args[0]):
            self.counts["pageable copy"] = self.counts.get("pageable copy", 0) + 1
            _where("pageable copy")
        if to_device and isinstance(out, torch.Tensor):
            if out is args[0] and not self.tags.has(out):  # the host tensor stays host data, as on CUDA
                out = out.view_as(out)
            self.tags.add(out)  # on the device now
        if name == "tensor" and kwargs.get("device") is not None:
            self.counts["pageable copy"] = self.counts.get("pageable copy", 0) + 1
            _where("pageable copy")
            self.tags.add(out)
        return out


def _target(args, kwargs):  # noqa: ANN001, ANN202
    return kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))


def _pageable_copy(args, kwargs) -> bool:  # noqa: ANN001
    src = args[0] if args else None
    if not isinstance(src, torch.Tensor) or src.device.type != "cpu":
        return False
    non_blocking = kwargs.get("non_blocking", any(a is True for a in args[1:]))
    return not non_blocking or (torch.cuda.is_available() and not src.is_pinned())


class HostWaits:
    """``with HostWaits(modules, optimizers, device) as w: step()``; ``w.total``, ``w.counts`` by op.
    ``device``: the step's device object (``Trainer.device``): a ``.to`` to that very object is a copy
    to the device (on the CPU a copy to the host reads the same, so the object tells them apart)."""

    def __init__(self, modules=(), optimizers=(), device: torch.device | None = None) -> None:  # noqa: ANN001
        self.tags, self.counts = _Tags(), {}
        for m in modules:
            for t in list(m.parameters()) + list(m.buffers()):
                self.tags.add(t)
        self.optimizers = list(optimizers)
        self._modes = (_HostCalls(self.tags, self.counts, device), _DeviceOps(self.tags, self.counts))

    def tag(self, *tensors) -> None:  # noqa: ANN002
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                self.tags.add(t)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> "HostWaits":
        for opt in self.optimizers:  # optimizer state made before counting is device data too
            self.tag([v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
                      and v.numel() > 1])
        self._hooks = [h for opt in self.optimizers for h in (opt.register_step_pre_hook(self._host_steps),
                                                               opt.register_step_post_hook(self._host_steps))]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        for m in reversed(self._modes):
            m.__exit__(*exc)
        for h in self._hooks:
            h.remove()

    def _host_steps(self, opt, *_) -> None:  # noqa: ANN001
        """An optimizer's step counts: host scalars unless it is fused (whose kernels read them)."""
        for s in opt.state.values():
            if isinstance(s.get("step"), torch.Tensor) and not opt.defaults.get("fused"):
                self.tags.discard(s["step"])


def _count_run(work: Path, steps: int, log_every: int) -> dict:
    """Host waits of one tiny ``elmo train`` run of ``steps`` steps (this process's tree)."""
    from tests.training.train_utils import sotu_sentences, write_corpus, write_options
    from training.trainer import Trainer, TrainOptions

    torch.set_num_threads(1)
    train = write_corpus(work / "train.txt", sotu_sentences(limit=400))
    opts = TrainOptions(train=str(train), options=str(write_options(work / "tiny.json")), out=str(work / f"run-{steps}"),
                        min_count=1, checkpoint_every=0, log_every=log_every, threads=1, shuffle_buffer=50,
                        max_steps=steps, train_eval_sentences=0, tensorboard=False)
    trainer = Trainer(opts, log=lambda s: None)
    with HostWaits([trainer.lm], [trainer.optimizer], trainer.device) as waits:
        trainer.run()
    return waits.counts


def count(work: Path, steps: int = 10, log_every: int = 5) -> dict:
    """Host waits per step of this process's trainer: runs of ``log_every`` and ``log_every + steps``
    steps, their difference over ``steps`` (what setting up, exporting and the first step cost cancels).
    Returns {"per_step": waits, "by_op": {op: waits}}."""
    short, long = _count_run(work, log_every, log_every), _count_run(work, log_every + steps, log_every)
    diff = {k: (long.get(k, 0) - short.get(k, 0)) / steps for k in long.keys() | short.keys()}
    return {"by_op": {k: v for k, v in diff.items() if v}, "per_step": sum(diff.values())}


def per_step(tree: Path, steps: int = 10, log_every: int = 5) -> float:
    """Host waits per training step of the trainer in ``tree``: two runs of log_every and
    log_every + steps steps, in a process importing ``tree``; their difference over ``steps``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tmp, str(steps), str(log_every)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"counting host waits in {tree} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def base_tree(tmp: Path) -> Path:
    """A detached git worktree of the tree before (BASE_COMMIT) under ``tmp`` (remove with git worktree remove)."""
    path = tmp / f"base-{BASE_COMMIT}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), BASE_COMMIT],
                   check=True, capture_output=True, text=True)
    return path


def line() -> str:
    """``host waits per training step: A -> B`` (A: BASE_COMMIT's trainer, B: this tree's), for bench_gpu --proxy."""
    with tempfile.TemporaryDirectory() as tmp:
        base = base_tree(Path(tmp))
        try:
            before = per_step(base)["per_step"]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    return f"host waits per training step: {before:.1f} -> {per_step(ROOT)['per_step']:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, help="count this tree's trainer only (default: the line, before -> now)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        work, steps, every = Path(a.worker[0]), int(a.worker[1]), int(a.worker[2])
        print(json.dumps(count(work, steps, every)))
    elif a.tree:
        res = per_step(a.tree.resolve(), a.steps)
        print(f"host waits per training step ({a.tree}): {res['per_step']:.1f} {res['by_op']}")
    else:
        print(line())


if __name__ == "__main__":
    main()
