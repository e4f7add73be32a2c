"""The run's checkpointer: what a checkpoint holds, in which order it is written, what a resume
accepts. The file format (safetensors, atomic writes, naming) is ``training.checkpoint``.

Every rank writes its own file (data position, torch RNG, carried LSTM state) first; after a
barrier the main rank writes the main file (model, optimizer, sampler RNG, sparse softmax state,
the run's metadata) and prunes old checkpoints, so a checkpoint exists only once it is complete.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint as ck
from .distributed import DistInfo, barrier
from .errors import CheckpointError


@dataclass
class Loaded:
    step: int
    tensors: dict[str, torch.Tensor]  # the main file's
    meta: dict
    local: dict[str, torch.Tensor]  # this rank's
    local_meta: dict


class Checkpointer:
    def __init__(self, ckpt_dir: Path, dist: DistInfo, keep: int) -> None:
        self.dir, self.dist, self.keep = ckpt_dir, dist, keep

    def latest(self) -> int | None:
        return ck.latest_step(self.dir, self.dist.world)

    def save(self, step: int, main: tuple[dict, dict] | None, local: tuple[dict, dict]) -> Path:
        """``main``: (tensors, meta) of the main file, built on the main rank only (None elsewhere);
        ``local``: this rank's (tensors, meta)."""
        ck.write_atomic(ck.rank_path(self.dir, step, self.dist.rank), *local)
        barrier(self.dist)
        path = ck.main_path(self.dir, step)
        if self.dist.is_main:
            ck.write_atomic(path, *main)
            ck.prune(self.dir, self.keep)
        barrier(self.dist)
        return path

    def load(self, expect: dict) -> Loaded:
        """The latest complete checkpoint; ``expect``: world, config and softmax updates it must match."""
        step = self.latest()
        if step is None:
            raise CheckpointError(f"{self.dir}: no complete checkpoint to resume from")
        tensors, meta = ck.read(ck.main_path(self.dir, step))
        _check_compatible(meta, expect)
        local, local_meta = ck.read(ck.rank_path(self.dir, step, self.dist.rank))
        return Loaded(step, tensors, meta, local, local_meta)


def _check_compatible(meta: dict, expect: dict) -> None:
    if meta["world"] != expect["world"]:
        raise CheckpointError(f"the checkpoint was written by {meta['world']} processes, this run has "
                              f"{expect['world']}; resume with the same number of processes")
    if (meta.get("softmax_updates") is None) != (expect["softmax_updates"] is None):
        raise CheckpointError("the checkpoint's softmax updates (--softmax-updates) differ from this run's; "
                              "resume with the same ones")
    if meta["config"] != expect["config"]:
        raise CheckpointError("the checkpoint's architecture or training options differ from this run's "
                              "(--options, --batch-size, --unroll, vocabulary); resume with the same ones")
    if meta.get("batching", "stateful") != expect["batching"]:
        raise CheckpointError(f"the checkpoint was trained with --batching {meta.get('batching', 'stateful')}, this "
                              f"run has {expect['batching']}; resume with the same batching")
