"""An ``elmo export onnx --output mixed`` export behind every door: ``Embedder``, ``elmo embed`` and
``elmo serve`` run its in-graph mix when the request is that mix (pooled and unit length too),
and refuse any other request before doing work, naming what the export computes."""
from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from elmo_cli.main import main
from elmo_core.errors import InputError
from elmo_core.vectors import VectorRequest
from export.onnx_export import export_onnx
from inference import Embedder
from corpora.sample import write_sample_corpus
from tests.helpers import SENTENCES
from tests.serving.server_utils import ServerProcess

MIX, GAMMA = [1.0, 0.0, -1.0], 0.5
# The export's own parity bound against torch (formats.export_spec.TOLERANCES["fp32"]: 1e-4 on
# every output); a mean or a unit-length scaling of such vectors stays within it (|v| ~ 1).
ATOL = 1e-4


@pytest.fixture(scope="module")
def mixed_export(tmp_path_factory) -> tuple[Path, Path]:
    from tests.helpers import TINY_OPTIONS, make_model_dir

    root = tmp_path_factory.mktemp("mixed")
    model = make_model_dir(root / "tiny", TINY_OPTIONS)
    export_onnx(model, root / "export", VectorRequest("mixed", MIX, GAMMA))
    return model, root / "export"


def test_the_embedder_runs_the_exports_mix_and_refuses_another(mixed_export):
    model, export = mixed_export
    with Embedder.open(model) as torch_emb, Embedder.open(export, "onnx") as onnx_emb:
        for kw in ({}, {"pool": "mean", "normalize": True}):
            want = torch_emb.embed_sentences(SENTENCES, output="mixed", mix_weights=MIX, gamma=GAMMA, **kw)
            got = onnx_emb.embed_sentences(SENTENCES, output="mixed", mix_weights=MIX, gamma=GAMMA, **kw)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)
        for kw in ({"output": "mixed"}, {"output": "all"}, {"output": "mixed", "mix_weights": MIX, "gamma": GAMMA,
                                                           "layer_norm": True}):
            with pytest.raises(InputError, match="exported with --output mixed"):
                onnx_emb.embed_sentences(SENTENCES, **kw)


def test_elmo_embed_and_serve_use_a_mixed_export(mixed_export, tmp_path, capsys):
    _, export = mixed_export
    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    base = ["embed", "--text", str(tmp_path / "corpus"), "--model", str(export), "--backend", "onnx", "--quiet"]
    assert main([*base[:3], "--out", str(tmp_path / "other"), *base[3:]]) == 2  # equal weights: not this export's
    assert "exported with --output mixed" in capsys.readouterr().err and not (tmp_path / "other").exists()
    assert main([*base[:3], "--out", str(tmp_path / "out"), *base[3:], "--mix", "1,0,-1", "--gamma", "0.5"]) == 0

    server = ServerProcess(export, "--backend", "onnx")
    try:
        body = {"sentences": SENTENCES[:2], "mix": MIX, "gamma": GAMMA}
        assert httpx.post(f"{server.url}/embed", json=body).status_code == 200
        refused = httpx.post(f"{server.url}/embed", json={"sentences": SENTENCES[:2]})
        assert refused.status_code == 422 and "exported with --output mixed" in refused.text
    finally:
        server.stop()
