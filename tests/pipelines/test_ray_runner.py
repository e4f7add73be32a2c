"""The Ray runner on a real local Ray cluster (2 CPUs): the same schema, rows, order and vectors as
the local runner, the shards spread over the workers, input order in every shard over repeated
runs, and resume shard by shard; workers that refuse a model swapped after the job started; a full
disk said as the local runner says it; an address that does not answer, before OUTPUT_DIR is
claimed."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines import embed_parquet
from corpora.sample import write_sample_corpus

from tests.helpers import check_a_model_swapped_after_planning, read_record, run_cli

ray = pytest.importorskip("ray", reason="Ray is the optional 'ray' extra (pip install -e '.[ray]')")


@pytest.fixture(scope="module")
def ray_cluster():
    if ray.is_initialized():  # a job planned earlier in this process reached Ray of its own
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_runner_matches_local_and_resumes(ray_cluster, tiny_dir, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=240, files=2, row_group_rows=40)
    opts = dict(id_column="id", keep_columns=["speech"], sort_window_rows=40, max_sentence_length=24,
                rows_per_shard=50, quiet=True)
    local = embed_parquet(corpus, tmp_path / "local", tiny_dir, **opts)
    remote = embed_parquet(corpus, tmp_path / "ray", tiny_dir, engine="ray", workers=2, precision="auto", **opts)
    assert remote["run"]["precision_reason"].startswith("judged by a worker's CPU: ")  # where the model runs
    assert remote["run"]["precision"] == local["run"]["precision"] == "fp32"  # the tiny model's products: too small
    a = ds.dataset(tmp_path / "local", format="parquet").to_table()
    b = ds.dataset(tmp_path / "ray", format="parquet").to_table()
    assert a.schema.equals(b.schema, check_metadata=False)
    assert a.column("id").to_pylist() == b.column("id").to_pylist() == list(range(240))
    for i, (x, y) in enumerate(zip(a.column("elmo").to_pylist(), b.column("elmo").to_pylist())):
        # the same predictor and plan as the local runner; only the threads differ (float32 sums of
        # K <= 64 O(1) products in another order: ~sqrt(K) * 2**-24 ~ 5e-7, see tests/test_doors.py)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0, err_msg=f"row {i}")
    for key in ("rows", "tokens", "windows", "windowed_rows", "null_rows"):
        assert local[key] == remote[key], key
    assert remote["windowed_rows"] > 0 and remote["engine"]["name"] == "ray"
    writers = {read_record(p)["writer"] for p in (tmp_path / "ray" / "_shards").glob("part-*")}
    assert len(remote["shards"]) == 6 and len(writers) == 2  # 3 shards a file, spread over both workers

    (tmp_path / "ray" / "_shards" / "part-00001-00001.parquet").unlink()  # published, killed before its record
    (tmp_path / "ray" / "part-00000-00002.parquet").unlink()  # killed before it was published
    again = embed_parquet(corpus, tmp_path / "ray", tiny_dir, engine="ray", workers=2, resume=True, **opts)
    assert again["this_run"]["shards"] == 1 and again["this_run"]["shards_kept"] == 5  # the first adopted
    assert read_record(tmp_path / "ray" / "_shards" / "part-00001-00001.parquet")["writer"] == "adopted"
    c = ds.dataset(tmp_path / "ray", format="parquet").to_table()
    assert c.column("id").to_pylist() == list(range(240))


def test_ray_rows_in_input_order_in_every_shard_over_runs(ray_cluster, tiny_dir, tmp_path):
    """What broke before: --workers 1 gave rows 0-999, 1024-1999, 1000-1023 in a shard."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=600, files=2, row_group_rows=64)
    for run in range(5):
        out = tmp_path / f"run{run}"
        embed_parquet(corpus, out, tiny_dir, engine="ray", workers=1 + run % 2, id_column="id", quiet=True,
                      sort_window_rows=16 + 24 * run, rows_per_shard=[1000, 130, 64, 300, 97][run])
        ids = []
        for shard in sorted(out.glob("part-*.parquet")):
            part = pq.read_table(shard, columns=["id"]).column("id").to_pylist()
            assert part == sorted(part) and part == list(range(part[0], part[0] + len(part))), (run, shard.name)
            ids += part
        assert ids == list(range(600)), run


def test_workers_refuse_a_model_swapped_after_the_job_started_and_commit_nothing_of_it(ray_cluster, tmp_path,
                                                                                       monkeypatch):
    """The weights are replaced (as ``mv`` does) between the driver's planning and the workers' load:
    each worker hashes the files before it loads them and refuses. Exit 2 naming the model, nothing
    committed; with the job's weights back, the job resumes (under the local engine)."""
    check_a_model_swapped_after_planning(tmp_path, monkeypatch, ["--engine", "ray", "--replicas", "2"], [])


def test_a_full_disk_under_ray_is_said_as_the_local_runner_says_it(ray_cluster, tiny_dir, small_fs, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=600, files=2, row_group_rows=100)
    r = run_cli("embed", "--text", corpus, "--out", small_fs / "out", "--model", tiny_dir, "--rows-per-shard", "100", "--quiet",
                "--engine", "ray", "--replicas", "1")
    assert r.returncode == 2 and "No space left on device; the disk is full: free space, then rerun with --resume" \
        in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "ray::" not in r.stderr


def test_a_ray_address_that_does_not_answer_leaves_output_dir_as_it_was(tiny_dir, tmp_path):
    """In a process of its own: this module's cluster would be taken as it is."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=20, files=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir),
                        "--engine", "ray", "--ray-address", f"127.0.0.1:{closed}", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--ray-address 127.0.0.1:{closed}: nothing answered there" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60 and not out.exists() and "Traceback" not in r.stderr


def test_a_job_starts_no_more_replicas_than_the_cluster_can_place():
    """12 asked on 2 CPUs at the least share (0.25) started 12 actors; Ray placed 8, and the shards
    the pool had handed the other 4 waited for ever: the job hung after 8 shards."""
    from pipelines.ray_runner import MIN_ACTOR_CPUS, schedulable_replicas

    assert schedulable_replicas(12, 12, MIN_ACTOR_CPUS, [{"CPU": 2.0}]) == 8
    assert schedulable_replicas(2, 12, 1.0, [{"CPU": 2.0}]) == 2 and schedulable_replicas(4, 3, 0.5, [{"CPU": 2.0}]) == 3
    assert schedulable_replicas(7, 7, 0.1, [{"CPU": 0.7}]) == 7  # 0.7 / 0.1 is 6.999...: seven fit
    assert schedulable_replicas(4, 12, 2.0, [{"CPU": 3.0}, {"CPU": 3.0}]) == 2  # one a node: an actor fits on one
    assert schedulable_replicas(5, 12, 0.5, [{"CPU": 16.0, "GPU": 1.0}], gpus_each=0.2) == 5
    assert schedulable_replicas(4, 12, 0.5, [{"CPU": 16.0}], gpus_each=1.0) == 0  # refused: none fits
