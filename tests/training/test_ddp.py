"""Data parallel: 2 gloo processes give the weights of 1 process on the combined batch."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from training import checkpoint as ck
from training.trainer import train

from tests.training.train_utils import ddp_worker, sotu_sentences, tiny_run, write_corpus, write_options

STEPS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(run_dir):
    ckpt = run_dir / "checkpoints"
    tensors, meta = ck.read(ck.main_path(ckpt, ck.latest_step(ckpt, meta_world(ckpt))))
    return {k: v for k, v in tensors.items() if k.startswith("model.")}, meta


def meta_world(ckpt) -> int:
    return 2 if any(ckpt.glob("*.rank1.safetensors")) else 1


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["packed", "stateful", "sentences"])
def test_two_processes_equal_one_process_on_the_combined_batch(tmp_path, batching):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    # No dropout: its masks depend on how rows are split. Sampled softmax stays on (same seed, same candidates).
    options = write_options(tmp_path / "nodrop.json", dropout=0.0)
    kw = dict(max_steps=STEPS, batch_size=8, batching=batching, options=str(options), checkpoint_every=0)
    train(tiny_run(tmp_path, p, out="one", **kw), log=lambda s: None)
    mp.spawn(ddp_worker, args=(2, _free_port(), tiny_run(tmp_path, p, out="two", **kw)), nprocs=2, join=True)
    one, meta1 = _weights(tmp_path / "one")
    two, meta2 = _weights(tmp_path / "two")
    assert meta1["world"] == 1 and meta2["world"] == 2 and meta1["step"] == meta2["step"] == STEPS
    assert meta1["tokens"] == meta2["tokens"]
    worst = max(float((one[k] - two[k]).abs().max()) for k in one)
    # gradients all-reduced across 2 ranks sum in another order: fp32 rounding over a few steps
    assert worst <= 1e-5, worst


@pytest.mark.slow
def test_torchrun_launch_equals_one_process(tmp_path):
    """The documented launch: ``torchrun --standalone --nproc-per-node 2 -m elmo_cli train ...``."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    torchrun = Path(sys.executable).with_name("torchrun")
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    options = write_options(tmp_path / "nodrop.json", dropout=0.0)
    args = ["train", "--text", str(p), "--options", str(options), "--max-steps", "3", "--batch-size", "8",
            "--checkpoint-every", "0", "--threads", "1", "--min-count", "1", "--shuffle-buffer", "50"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "ELMO_DIST_TIMEOUT_S": "120"}
    one = subprocess.run([sys.executable, "-m", "elmo_cli", *args, "--out", str(tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "elmo_cli", *args,
                          "--out", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    w1, meta1 = _weights(tmp_path / "one")
    w2, meta2 = _weights(tmp_path / "two")
    assert meta1["world"] == 1 and meta2["world"] == 2 and meta1["step"] == meta2["step"] == 3
    # gradients all-reduced across 2 ranks sum in another order: fp32 rounding over a few steps
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst <= 1e-5, worst
    for d in ("one", "two"):  # both wrote the published layout
        assert (tmp_path / d / "model" / "weights.hdf5").is_file()
