"""Checkpoints: what one holds, in which order it is written, what a resume accepts (``Checkpointer``),
and the files, safetensors (no pickle) written atomically (temporary name, then rename).

A checkpoint at step S is ``ckpt-S.safetensors`` (model, optimizer, sampler RNG, sparse softmax
state; the run's metadata as JSON in the safetensors metadata) plus one ``ckpt-S.rank{r}.safetensors``
per data-parallel rank (that rank's data position, torch RNG and carried LSTM state). Every rank
file is written first; after a barrier the main rank writes the main file and prunes old
checkpoints, so a checkpoint exists only once it is complete.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from storage.atomic import atomic_path

from .distributed import DistInfo, barrier
from .errors import CheckpointError

_MAIN = re.compile(r"^ckpt-(\d+)\.safetensors$")
_RANK = re.compile(r"^ckpt-(\d+)\.rank\d+\.safetensors$")
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
        mode = tmp.stat().st_mode & 0o777  # the umask's, as every file the project writes
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})
        os.chmod(tmp, mode)  # safetensors makes its files 0600: another user of a shared run could not resume


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and JSON metadata of one checkpoint file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(META_KEY, "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (FileNotFoundError, SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({e}); it is damaged: delete it and the files of "
                              f"its step beside it to resume from the checkpoint before") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: no '{META_KEY}' metadata; not an elmo training checkpoint")
    return tensors, meta


def _steps(ckpt_dir: Path) -> list[int]:
    """The steps of the main files in ``ckpt_dir``, oldest first."""
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if (m := _MAIN.match(p.name)))


def latest_step(ckpt_dir: Path, world: int) -> int | None:
    """The highest step whose main file and every rank file exist."""
    if not ckpt_dir.is_dir():
        return None
    complete = (s for s in reversed(_steps(ckpt_dir)) if all(rank_path(ckpt_dir, s, r).is_file() for r in range(world)))
    return next(complete, None)


def prune(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (called once the newest main file is written),
    and rank files older than it without their main file (a kill while pruning). Rank files go
    first: a kill between leaves a main file without them, which no resume takes and the next
    prune deletes."""
    steps = _steps(ckpt_dir)
    old = set(steps[:-keep]) if keep > 0 else set()
    for p in ckpt_dir.iterdir():
        m = _RANK.match(p.name)
        if m and (int(m.group(1)) in old or steps and int(m.group(1)) < steps[-1] and int(m.group(1)) not in steps):
            p.unlink(missing_ok=True)
    for step in sorted(old):
        main_path(ckpt_dir, step).unlink(missing_ok=True)


def json_tensor(obj: object) -> torch.Tensor:
    """A JSON-able object as a uint8 tensor of its UTF-8 JSON: state too large for the file's JSON
    header (safetensors caps it at 100 MB; a data position holds the shuffle buffer's sentences)."""
    return torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)


def tensor_json(tensor: torch.Tensor) -> Any:
    """``json_tensor``'s object back."""
    return json.loads(tensor.numpy().tobytes().decode())


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
    named = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")} | meta["scalars"]
    for name, value in named.items():  # "{param index}.{state key}"
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    try:
        opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"the checkpoint's optimizer state does not fit this optimizer ({e}); "
                              "resume with the same --optimizer") from None


class Checkpointer:
    def __init__(self, ckpt_dir: Path, dist: DistInfo, keep: int) -> None:
        self.dir, self.dist, self.keep = ckpt_dir, dist, keep

    def latest(self) -> int | None:
        return latest_step(self.dir, self.dist.world)

    def save(self, step: int, main: tuple[dict, dict] | None, local: tuple[dict, dict]) -> Path:
        """``main``: (tensors, meta) of the main file, built on the main rank only (None elsewhere);
        ``local``: this rank's (tensors, meta)."""
        write_atomic(rank_path(self.dir, step, self.dist.rank), *local)
        barrier(self.dist)
        path = main_path(self.dir, step)
        if self.dist.is_main:
            write_atomic(path, *main)
            prune(self.dir, self.keep)
        barrier(self.dist)
        return path

    def load(self, expect: dict) -> tuple[int, dict[str, torch.Tensor], dict, dict[str, torch.Tensor], dict]:
        """The latest complete checkpoint: its step, the main file's tensors and metadata, this rank's
        tensors and metadata; ``expect``: world, config and softmax updates it must match."""
        step = self.latest()
        if step is None:
            raise CheckpointError(f"{self.dir}: no complete checkpoint to resume from")
        tensors, meta = read(main_path(self.dir, step))
        _check_compatible(meta, expect)
        local, local_meta = read(rank_path(self.dir, step, self.dist.rank))
        return step, tensors, meta, local, local_meta


REQUIRED = ("step", "tokens", "elapsed", "world", "config", "optimizer")  # what every checkpoint's metadata holds


def _check_compatible(meta: dict, expect: dict) -> None:
    if missing := [k for k in REQUIRED if k not in meta]:
        raise CheckpointError(f"the checkpoint's metadata lacks {missing}: not written by elmo train, or damaged; "
                              f"start a new run")
    if meta["world"] != expect["world"]:
        raise CheckpointError(f"the checkpoint was written by {meta['world']} processes, this run has "
                              f"{expect['world']}; resume with the same number of processes")
    if (meta.get("softmax_updates") is None) != (expect["softmax_updates"] is None):
        raise CheckpointError("the checkpoint's softmax updates (--softmax-updates) differ from this run's; "
                              "resume with the same ones")
    if meta["config"] != expect["config"]:
        raise CheckpointError("the checkpoint's architecture or training options differ from this run's "
                              "(--options, --batch-size, --unroll, vocabulary); resume with the same ones")
    if meta.get("optimizer_name", expect["optimizer_name"]) != expect["optimizer_name"]:  # absent: an older checkpoint
        raise CheckpointError(f"the checkpoint was trained with --optimizer {meta['optimizer_name']}, this run has "
                              f"{expect['optimizer_name']}; resume with the same --optimizer")
    if meta.get("vocab_sha256", expect["vocab_sha256"]) != expect["vocab_sha256"]:
        raise CheckpointError("the checkpoint was trained with another vocabulary (other words, or the same in "
                              "another order: other ids) than this run's (--vocab, else RUN_DIR/vocab.txt); resume "
                              "with the run's own vocab.txt")
    if meta.get("batching", "stateful") != expect["batching"]:
        raise CheckpointError(f"the checkpoint was trained with --batching {meta.get('batching', 'stateful')}, this "
                              f"run has {expect['batching']}; resume with the same batching")
