"""What a run directory (``elmo train --out``) may hold when a run starts, checked before anything is
read or written: a fresh run takes an empty or new directory; ``--resume`` one with a complete
checkpoint. A directory holding anything else is refused, never reused or overwritten: a user's
files, an earlier run's vocabulary (a fresh run would train on it, whatever its corpus), a run that
stopped before its first checkpoint (delete it to start over). The run's own files must not be
corpus files either: an ``--out`` inside the ``--text`` or ``--valid`` directory is refused.
"""
from __future__ import annotations

import re
from pathlib import Path

from .errors import CheckpointError

CHECKPOINTS_DIR = "checkpoints"
_CHECKPOINT = re.compile(r"^ckpt-\d+\.safetensors$")  # a main file (``checkpoint.main_path``)


def has_checkpoint(run: str | Path) -> bool:
    """Whether RUN_DIR holds a checkpoint's main file (written last: the checkpoint is complete
    once it is there, ``training.checkpoint``)."""
    ckpts = Path(run) / CHECKPOINTS_DIR
    return ckpts.is_dir() and any(_CHECKPOINT.match(p.name) for p in ckpts.iterdir())


RUN_FILES = frozenset({"vocab.txt", "run.json", "metrics.jsonl", "summary.json", CHECKPOINTS_DIR, "tensorboard",
                       "model"})  # what a run writes in RUN_DIR


def holds_run_files_only(run: str | Path) -> bool:
    """Whether every entry of RUN_DIR is one a run writes (a folder of a user's files is not one)."""
    return all(p.name in RUN_FILES for p in Path(run).iterdir())


def check_run_dir(out: str | Path, resume: bool, corpora: dict[str, str | None]) -> None:
    """``out`` fit for a run (the module's rule); ``corpora``: the corpus flags (``--text``,
    ``--valid``) and their values. CheckpointError naming the directory and what to do."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is a file; give a directory (new or empty) for the run")
    for flag, spec in corpora.items():  # a corpus directory's files are its shards (not its subfolders')
        if spec and Path(spec).is_dir() and out.resolve() == Path(spec).resolve():
            raise CheckpointError(f"--out {out} is the corpus directory {flag} {spec}: the run's files would be "
                                  f"read as corpus; put the run elsewhere (a subfolder is fine)")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if resume:
        if not has_checkpoint(out):
            raise CheckpointError(f"--resume: {out / CHECKPOINTS_DIR} holds no checkpoint to resume from; run "
                                  f"without --resume to start (into an empty or new --out)")
        return
    if has_checkpoint(out):
        raise CheckpointError(f"{out} already holds checkpoints; pass --resume or choose another --out")
    if held:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise CheckpointError(f"--out {out} is not empty ({shown}) and holds no checkpoint to resume from; a run "
                              f"starts in an empty or new directory: choose another --out, or delete this one (a "
                              f"run that stopped before its first checkpoint) to start over")
