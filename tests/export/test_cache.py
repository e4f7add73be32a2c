"""ONNX exports built on demand (``elmo embed / serve --backend onnx --precision P --model MODEL_DIR``):
built and validated once, reused, rebuilt when the weights change; the precision and the CPU's int8
instructions printed and recorded."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from storage.locations import cache_root, file_sha256
from export.cache import cached_onnx_export, export_key, on_demand_dedup
from formats.model_dir import resolve_model
from export.quantize import weight_bits
from inference.precision import INT8_CPU_FLAGS, cpu_flags, int8_cpu_report

from tests.helpers import read_record


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _vectors(out: Path) -> np.ndarray:
    table = pq.read_table(out, columns=["elmo"])
    return np.concatenate([np.asarray(v, np.float32) for v in table.column("elmo").to_pylist()])  # (N, D)


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("ELMO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "elmo-pipeline"


def test_int8_embed_exports_once_then_reuses_and_records_it(tiny_dir, tmp_path, cache, capsys):
    write_sample_corpus(tmp_path / "corpus", rows=60, files=1)
    args = ["--model", str(tiny_dir), "--backend", "onnx", "--precision", "int8", "--output", "mixed", "--quiet"]
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "a"), *args]) == 0
    err = capsys.readouterr().err
    assert "at int8 once (validated against torch)" in err
    entries = list((cache / "onnx").iterdir())
    assert [e.name[:5] for e in entries] == ["int8-"]  # one whole entry, no temporary left
    manifest = json.loads((entries[0] / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["parity"]["passed"] is True
    job = read_record(tmp_path / "a" / "_manifest.parquet")
    assert job["run"]["precision"] == "int8" and int8_cpu_report() in job["run"]["precision_reason"]
    assert job["run"]["model"] == str(entries[0]) and job["run"]["source"] == str(tiny_dir.resolve())

    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "b"), *args]) == 0
    err = capsys.readouterr().err
    assert "onnx: exporting" not in err
    assert read_record(tmp_path / "b" / "_manifest.parquet")["run"]["model"] == str(entries[0])
    assert list((cache / "onnx").iterdir()) == entries
    assert np.array_equal(_vectors(tmp_path / "a"), _vectors(tmp_path / "b"))

    # The int8 vectors against torch fp32's: per-token cosine >= 0.999, the text target int8 is
    # planned to on the job's own first rows (export.quantize), which are these rows.
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "t"), "--model", str(tiny_dir),
                 "--output", "mixed", "--quiet"]) == 0
    got, want = _vectors(tmp_path / "a"), _vectors(tmp_path / "t")  # (N, D)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert got.shape == want.shape and cos.min() >= 0.999, cos.min()


def test_the_cached_export_is_rebuilt_when_the_weights_change(tiny_dir, tmp_path):
    first, built = cached_onnx_export(tiny_dir, "int8", root=tmp_path / "c")
    assert built and cached_onnx_export(tiny_dir, "int8", root=tmp_path / "c") == (first, False)
    weights = resolve_model(tiny_dir).weights
    with h5py.File(weights, "r+") as f:  # one parameter changed in place: a fine-tuned model
        name = next(n for n in _datasets(f) if f[n].dtype.kind == "f" and f[n].size > 1)
        f[name][...] = f[name][...] * np.float32(1.01)
    second, built = cached_onnx_export(tiny_dir, "int8", root=tmp_path / "c")
    assert built and second != first
    assert json.loads((second / "manifest.json").read_text())["source"]["weights_sha256"] == file_sha256(weights)
    assert file_sha256(second / "model.onnx") != file_sha256(first / "model.onnx")


def _datasets(group: h5py.Group) -> list[str]:
    names: list[str] = []
    group.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset) else None)
    return names


def test_an_export_runs_its_own_precision_and_refuses_another(tiny_dir, tmp_path, cache, capsys):
    export, _ = cached_onnx_export(tiny_dir, "fp32")
    write_sample_corpus(tmp_path / "corpus", rows=20, files=1)
    base = ["embed", "--text", str(tmp_path / "corpus"), "--model", str(export), "--backend", "onnx", "--quiet"]
    assert main([*base[:3], "--out", str(tmp_path / "a"), *base[3:], "--precision", "int8"]) == 2
    assert "is an fp32 ONNX export; for --precision int8 pass the model directory" in capsys.readouterr().err
    assert main([*base[:3], "--out", str(tmp_path / "b"), *base[3:]]) == 0  # no --precision: the export's
    assert read_record(tmp_path / "b" / "_manifest.parquet")["run"]["precision"] == "fp32"


def test_int8_on_the_torch_backend_and_bf16_on_demand_are_refused(tiny_dir, tmp_path, cache, capsys):
    write_sample_corpus(tmp_path / "corpus", rows=20, files=1)
    base = ["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "a"), "--model", str(tiny_dir), "--quiet"]
    assert main([*base, "--precision", "int8"]) == 2
    assert "--precision int8 runs on the onnx backend" in capsys.readouterr().err
    assert main([*base, "--backend", "onnx", "--precision", "bf16"]) == 2
    assert "bf16 cannot be validated on ONNX Runtime's CPU provider" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (cache / "onnx").exists()


def test_int8_instructions_are_reported_from_the_flags():
    assert "no int8 dot-product instructions" in int8_cpu_report(frozenset({"avx2", "fma"}))
    for flag in INT8_CPU_FLAGS:
        assert int8_cpu_report(frozenset({"avx2", flag})) == f"this CPU multiplies int8 in hardware ({flag})"


def test_the_cache_key_follows_the_cpus_int8_weight_range_and_the_char_cnn_form(tiny_dir):
    assert on_demand_dedup("int8", cuda=True) and on_demand_dedup("int8", cuda=False)
    assert on_demand_dedup("fp32", cuda=False) and not on_demand_dedup("fp32", cuda=True)
    vnni, avx2 = frozenset({"avx2", "avx512_vnni"}), frozenset({"avx2"})
    for precision in ("int8", "auto"):  # 8- and 7-bit weights are different graphs
        assert export_key(tiny_dir, precision, flags=vnni) != export_key(tiny_dir, precision, flags=avx2)
        assert export_key(tiny_dir, precision, flags=vnni) == export_key(tiny_dir, precision, flags=vnni)
    assert export_key(tiny_dir, "fp32", flags=vnni) == export_key(tiny_dir, "fp32", flags=avx2)
    assert export_key(tiny_dir, "fp32", cuda=True) != export_key(tiny_dir, "fp32", cuda=False)
    assert export_key(tiny_dir, "int8", cuda=True) == export_key(tiny_dir, "int8", cuda=False)


def test_the_int8_export_runs_the_char_cnn_per_distinct_token_with_this_cpus_weight_range(tiny_dir, tmp_path):
    entry, _ = cached_onnx_export(tiny_dir, "int8", root=tmp_path / "c")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["spec"]["token_dedup"] is True and "Unique" in manifest["onnx"]["op_types"]
    assert manifest["int8"]["weight_bits"] == weight_bits(cpu_flags())
    assert "char_cnn.convolutions" in manifest["int8"]["quantized"] + manifest["int8"]["kept_fp32"]


def test_serve_runs_the_int8_export_of_a_model_directory(tiny_dir, cache):
    import httpx

    from inference import Embedder
    from tests.helpers import SENTENCES
    from tests.serving.server_utils import ServerProcess, reference

    server = ServerProcess(tiny_dir, "--backend", "onnx", "--precision", "int8", timeout=120)
    try:
        [export] = list((cache / "onnx").iterdir())
        assert any("at int8 once" in line for line in server.stderr)
        info = httpx.get(f"{server.url}/info").json()
        assert (info["backend"], info["precision"], info["path"]) == ("onnx", "int8", str(export))
        answer = httpx.post(f"{server.url}/embed", json={"sentences": [SENTENCES[0]]})
        assert answer.status_code == 200, answer.text
        with Embedder.open(export, "onnx") as embedder:
            # the same int8 graph on the same CPU, the sentence alone either way
            np.testing.assert_allclose(np.asarray(answer.json()["embeddings"][0], np.float32),
                                       reference(embedder, SENTENCES[0]), atol=1e-6, rtol=0)
    finally:
        server.stop()


def _dictionary_model(out: Path, chars: str = "char.dic") -> Path:
    """A tiny random model that takes its character ids from a dictionary file (ELMoForManyLangs')."""
    import torch

    from elmo_core import BiLM, ElmoConfig
    from elmo_core.dictionaries import CHAR_SPECIALS, DictionaryTokenizer
    from formats import save_model

    ids = {c: i for i, c in enumerate([*CHAR_SPECIALS, *"abcdefghijklmnopqrstuvwxyz."])}
    config = ElmoConfig.from_dict({
        "lstm": {"dim": 16, "projection_dim": 8, "n_layers": 1, "cell_clip": 3.0, "proj_clip": 3.0,
                 "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4], [2, 4]], "n_highway": 1,
                     "n_characters": len(ids) + 1, "max_characters_per_token": 20, "activation": "relu"},
        "dictionaries": {"chars": chars}})
    torch.manual_seed(0)
    save_model(BiLM(config, DictionaryTokenizer(ids, None, 20)), out, "hdf5")
    return out


def test_a_dictionary_models_key_and_identity_follow_its_dictionary(tmp_path):
    """Two ids swapped in char.dic reused the cached export (other vectors than torch's, exit 0) and
    kept the job's model identity."""
    from inference.registry import model_identity

    model = _dictionary_model(tmp_path / "m")
    key, identity = export_key(model, "fp32"), model_identity(model)
    lines = (model / "char.dic").read_text().splitlines()
    lines[-1], lines[-2] = lines[-2], lines[-1]
    (model / "char.dic").write_text("\n".join(lines) + "\n")
    assert export_key(model, "fp32") != key and model_identity(model) != identity
    assert set(identity) == {"path", "format", "sha256", "options_sha256", "dictionaries_sha256"}


def test_a_dictionary_named_outside_the_model_directory_is_refused(tmp_path):
    """An export copies each dictionary under its name: '../victim/char.dic' overwrote a user's file."""
    from elmo_core.config import ConfigError
    from elmo_core import ElmoConfig

    for name in ("../victim/char.dic", "/etc/passwd", "..", ""):
        with pytest.raises(ConfigError, match="must be a file name beside options.json"):
            ElmoConfig.from_dict({"lstm": {"dim": 16, "projection_dim": 8, "n_layers": 1},
                                  "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4]], "n_highway": 0,
                                               "n_characters": 40, "max_characters_per_token": 20},
                                  "dictionaries": {"chars": name}})
