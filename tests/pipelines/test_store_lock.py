"""The lock of an OUTPUT_DIR on an object store (``pipelines/store_lock.py``), against a real
S3-compatible server on 127.0.0.1: one driver at a time, a lease taken and renewed by conditional
writes, and a finished job's lock object deleted only if it is still its own."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from pipelines.errors import OutputDirError
from pipelines.output_dir import open_output
from pipelines.store_lock import StoreLock
from tests.pipelines.store_utils import STORE_RUN, store_names
from tests.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_two_drivers_on_one_output_the_second_is_refused(s3, tiny_dir, tmp_path, capsys, spawn):
    """A driver holding the lock (a real process) refuses a second, naming it; SIGKILLed, it frees
    the lock at once on this host. A holder elsewhere frees it when its lease runs out."""
    corpus, model = tmp_path / "corpus", tiny_dir
    write_sample_corpus(corpus, rows=300, files=2, row_group_rows=50)
    s3.create_dir("locks")
    holder = spawn([sys.executable, "-c", "import sys, time; from pipelines.output_dir import open_output; "
                    "open_output(sys.argv[1]).lock().__enter__(); print('locked', flush=True); "
                    "time.sleep(120)", "s3://locks/out"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *STORE_RUN]) == 2
        assert f"s3://locks/out is in use by another elmo embed job (pid {holder.pid} on host" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *STORE_RUN, "--resume"]) == 0

    def held_elsewhere(lease: float) -> None:
        record = {"pid": 1, "host": "another-node", "released": False, "since": "then", "lease_seconds": lease,
                  "command": "elmo embed ..."}
        with s3.open_output_stream("locks/out/.elmo.lock") as f:
            f.write(json.dumps(record).encode())

    held_elsewhere(3600.0)
    capsys.readouterr()
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *STORE_RUN, "--resume"]) == 2
    assert "(pid 1 on host another-node" in capsys.readouterr().err
    held_elsewhere(1.0)
    time.sleep(2.5)  # the store's clock (its Last-Modified against its Date) says the lease ran out
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *STORE_RUN, "--resume"]) == 0


def test_a_driver_that_lost_its_lease_stops_before_its_manifest(s3):
    """The lease is renewed every lease/4 s by a conditional write; once another driver has taken
    the lock (after the lease ran out), the renewal fails and the job may not commit its manifest."""
    s3.create_dir("lease")
    with StoreLock(open_output("s3://lease/out"), lease=0.4) as lock:
        time.sleep(0.5)  # longer than the lease: still held, as it was renewed
        lock.check()
        with s3.open_output_stream("lease/out/.elmo.lock") as f:  # taken by another after a stall of this one
            f.write(json.dumps({"pid": 1, "host": "another-node", "released": False, "lease_seconds": 120}).encode())
        wait_until(lambda: lock.lost, "the renewal found the lock taken")
        with pytest.raises(OutputDirError, match="this job lost its lock"):
            lock.check()
    assert json.loads(s3.open_input_stream("lease/out/.elmo.lock").read())["host"] == "another-node"  # not released


def test_a_finished_job_deletes_its_own_lock_object_never_another_jobs(s3):
    """``finished`` deletes the lock object only if it is still the version this job wrote (a
    conditional delete): a lock another driver wrote meanwhile stays, neither deleted nor released."""
    s3.create_dir("finish")
    with StoreLock(open_output("s3://finish/mine")) as lock:
        lock.finished()
    assert store_names(s3, "finish/mine") == []
    theirs = json.dumps({"pid": 1, "host": "another-node", "released": False, "lease_seconds": 120}).encode()
    with StoreLock(open_output("s3://finish/theirs")) as lock:
        with s3.open_output_stream("finish/theirs/.elmo.lock") as f:  # taken by another after a stall of this one
            f.write(theirs)
        lock.finished()
    assert s3.open_input_stream("finish/theirs/.elmo.lock").read() == theirs
