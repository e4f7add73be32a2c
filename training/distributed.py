"""torch.distributed plumbing: torchrun's environment -> a process group (gloo on CPU, nccl on GPU)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(device: str) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE > 1); a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        # A rank that never arrives fails the job after ELMO_DIST_TIMEOUT_S (default 10 min), not torch's 30.
        timeout = timedelta(seconds=float(os.environ.get("ELMO_DIST_TIMEOUT_S", "600")))
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=timeout)
    return DistInfo(dist.get_rank(), dist.get_world_size())


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def any_true(info: DistInfo, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on some rank."""
    return max_all(info, 1.0 if flag else 0.0) > 0 if info.enabled else flag


def sum_all(info: DistInfo, values: torch.Tensor) -> torch.Tensor:
    """Shape: (K,) -> (K,) summed over ranks (float64, on CPU)."""
    t = values.detach().double().cpu().clone()
    if info.enabled:
        dist.all_reduce(t)
    return t


def max_all(info: DistInfo, value: float) -> float:
    """The largest of the ranks' ``value``s, on every rank."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
