"""Checkpoints in safetensors (no pickle), written atomically (temporary name, then rename).

A checkpoint at step S is ``ckpt-S.safetensors`` (model, optimizer, sampler RNG; run metadata as
JSON in the safetensors metadata) plus one ``ckpt-S.rank{r}.safetensors`` per data-parallel rank
(that rank's data position, torch RNG and carried LSTM state). Every rank file is written first;
the main file last, so a checkpoint exists only once it is complete.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from storage.atomic import atomic_path

from .errors import CheckpointError

_MAIN = re.compile(r"^ckpt-(\d+)\.safetensors$")
META_KEY = "elmo_checkpoint"


def main_path(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"ckpt-{step:08d}.safetensors"


def rank_path(ckpt_dir: Path, step: int, rank: int) -> Path:
    return ckpt_dir / f"ckpt-{step:08d}.rank{rank}.safetensors"


def write_atomic(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write tensors + JSON metadata to ``path`` via a temporary file in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and JSON metadata of one checkpoint file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(META_KEY, "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (FileNotFoundError, SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: no '{META_KEY}' metadata; not an elmo training checkpoint")
    return tensors, meta


def latest_step(ckpt_dir: Path, world: int) -> int | None:
    """The highest step whose main file and every rank file exist."""
    if not ckpt_dir.is_dir():
        return None
    steps = sorted((int(m.group(1)) for p in ckpt_dir.iterdir() if (m := _MAIN.match(p.name))), reverse=True)
    for step in steps:
        if all(rank_path(ckpt_dir, step, r).is_file() for r in range(world)):
            return step
    return None


def prune(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints."""
    steps = sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if (m := _MAIN.match(p.name)))
    for step in steps[:-keep] if keep > 0 else []:
        main_path(ckpt_dir, step).unlink(missing_ok=True)
        for p in ckpt_dir.glob(f"ckpt-{step:08d}.rank*.safetensors"):
            p.unlink(missing_ok=True)


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer's state into named tensors and JSON (param groups, scalar state)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = value
    for name, value in meta["scalars"].items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    try:
        opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer ({e}); "
                              "resume with the same --optimizer") from None
