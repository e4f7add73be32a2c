"""The Ray Data engine on a real local Ray cluster (2 CPUs, 2 workers): same schema and vectors as local."""
from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pytest

from pipelines import embed_parquet
from pipelines.corpus import write_sample_corpus

ray = pytest.importorskip("ray", reason="Ray Data is the optional 'ray' extra (pip install -e '.[ray]')")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_engine_matches_local_and_resumes(ray_cluster, tiny_dir, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=240, files=2, row_group_rows=40)
    opts = dict(id_column="id", keep_columns=["speech"], sort_window_rows=40, max_sentence_length=24, quiet=True)
    local = embed_parquet(corpus, tmp_path / "local", tiny_dir, **opts)
    remote = embed_parquet(corpus, tmp_path / "ray", tiny_dir, engine="ray", workers=2, **opts)
    a = ds.dataset(tmp_path / "local", format="parquet").to_table()
    b = ds.dataset(tmp_path / "ray", format="parquet").to_table()
    assert a.schema.equals(b.schema, check_metadata=False)
    assert a.column("id").to_pylist() == b.column("id").to_pylist() == list(range(240))
    for i, (x, y) in enumerate(zip(a.column("elmo").to_pylist(), b.column("elmo").to_pylist())):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=0, err_msg=f"row {i}")
    for key in ("rows", "tokens", "windows", "windowed_rows", "null_rows"):
        assert local[key] == remote[key], key
    assert remote["windowed_rows"] > 0 and remote["engine"]["name"] == "ray"
    assert len(list((tmp_path / "ray").glob("part-00000-*.parquet"))) >= 2  # both workers had blocks

    (tmp_path / "ray" / "_ray-00001.json").unlink()  # as if killed before file 1 was committed
    again = embed_parquet(corpus, tmp_path / "ray", tiny_dir, engine="ray", workers=2, resume=True, **opts)
    assert again["this_run"]["shards"] == 1 and again["this_run"]["shards_kept"] == 1
    c = ds.dataset(tmp_path / "ray", format="parquet").to_table()
    assert c.column("id").to_pylist() == list(range(240))
