"""Mistakes that used to run, ignore a flag or destroy a file, each refused before anything is
written: exit 2, the flag or path named, the file untouched."""
from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests.helpers import run_cli


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "sentences.txt"
    path.write_text("The cat sat .\nA dog ran .\n")
    return path


def _refused(r, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


def test_hdf5_output_never_replaces_a_file_that_is_not_an_earlier_hdf5_output(tiny_dir, text, tmp_path):
    before = text.read_bytes()
    _refused(run_cli("embed", "--text", text, "--out", text, "--format", "hdf5", "--model", tiny_dir),
             str(text), "not an earlier elmo embed --format hdf5 output")
    assert text.read_bytes() == before
    shipped = Path(__file__).resolve().parents[2] / "models" / "default"
    model = tmp_path / "model"
    shutil.copytree(shipped, model)
    for name in ("weights.hdf5", "softmax.hdf5"):  # the model's own weights were replaced, exit 0
        weights = (model / name).read_bytes()
        _refused(run_cli("embed", "--text", text, "--out", model / name, "--format", "hdf5", "--model", model),
                 str(model / name), "not an earlier elmo embed --format hdf5 output")
        assert (model / name).read_bytes() == weights
    gap = tmp_path / "gap.txt"
    gap.write_text("a b\n\nc d\n")
    _refused(run_cli("embed", "--text", gap, "--out", tmp_path / "new" / "v.hdf5", "--format", "hdf5", "--model",
                     tiny_dir), "line 2 is empty")
    assert list((tmp_path / "new").iterdir()) == []  # no lock file left: one file has nothing to resume
    out = tmp_path / "vectors.hdf5"
    for _ in range(2):  # an earlier hdf5 output is replaced, as allennlp elmo does
        assert run_cli("embed", "--text", text, "--out", out, "--format", "hdf5", "--model", tiny_dir,
                       "--quiet").returncode == 0


@pytest.mark.parametrize("flag, value", [("--compression", "zstd"), ("--rows-per-shard", "5"),
                                         ("--writer-threads", "2"), ("--sort-window-tokens", "500"),
                                         ("--verify-inputs", None)])
def test_hdf5_output_refuses_the_shards_flags(tiny_dir, text, tmp_path, flag, value):
    _refused(run_cli("embed", "--text", text, "--out", tmp_path / "v.hdf5", "--format", "hdf5", "--model", tiny_dir,
                     flag, *([value] if value else [])), flag)
    assert not (tmp_path / "v.hdf5").exists() and not (tmp_path / ".v.hdf5.lock").exists()


@pytest.mark.parametrize("flags, named", [(["--replicas", "3"], "--engine ray"),
                                          (["--spark-master", "local[2]"], "--engine spark"),
                                          (["--spark-conf", "spark.executor.memory=1g"], "--engine spark"),
                                          (["--writer-threads", "200000"], "at most 4096"),
                                          (["--layout", "fused", "--backend", "onnx"], "--layout fused"),
                                          (["--calibration", "CALIBRATION"], "--calibration")])
def test_embed_refuses_what_it_would_ignore_or_choke_on(tiny_dir, text, tmp_path, flags, named):
    flags = [str(text) if f == "CALIBRATION" else f for f in flags]
    out = tmp_path / "out"
    _refused(run_cli("embed", "--text", text, "--out", out, "--model", tiny_dir, *flags), named)
    assert not out.exists()


def test_export_onnx_refuses_a_calibration_nothing_would_read(tiny_dir, text, tmp_path):
    out = tmp_path / "export"
    _refused(run_cli("export", "onnx", "--model", tiny_dir, "--out", out, "--calibration", text, "--no-validate"),
             "--calibration", "--precision fp32 nothing reads it")
    assert not out.exists()


@pytest.mark.parametrize("device, words", [("bogus", "cpu, cuda or cuda:N"), ("cuda:-1", "cpu, cuda or cuda:N"),
                                           ("meta", "cpu, cuda or cuda:N")])
def test_train_checks_its_device_first(text, tmp_path, device, words):
    out = tmp_path / "run"
    _refused(run_cli("train", "--text", text, "--out", out, "--device", device), "--device", words)
    assert not out.exists()


def test_train_on_a_gpu_this_machine_lacks_is_refused_first(text, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda is valid here")
    _refused(run_cli("train", "--text", text, "--out", tmp_path / "run", "--device", "cuda"), "no CUDA GPU")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, words", [
    (["perplexity", "--model", "TINY", "--text", "TEXT", "--batch-size", "8"],
     ["--batch-size: elmo train's global batch (rows)", "--eval-batch-size"]),
    (["engine", "--model", "TINY", "--device", "cuda"],
     ["--device: none here", "torch backend in fp32 on the CPU", "docs/export.md"]),
    (["export", "onnx", "--model", "TINY", "--device=cuda:0"], ["--device: none here", "ONNX Runtime's CPU provider"]),
    (["export", "triton", "--model", "TINY", "--max-queue-delay-us", "500"],
     ["--max-queue-delay-us: now --max-wait-ms, in milliseconds (2000 us is --max-wait-ms 2)"]),
    (["embed", "--model", "TINY", "--text", "TEXT", "--max-tokens-per-batch", "300"],
     ["--max-tokens-per-batch: now --max-batch-tokens"]),
])
def test_a_flag_renamed_or_not_taken_is_refused_naming_what_to_type(tiny_dir, text, tmp_path, argv, words):
    out = tmp_path / "out"
    argv = [str(tiny_dir) if a == "TINY" else str(text) if a == "TEXT" else a for a in argv]
    _refused(run_cli(*argv, *([] if argv[0] == "perplexity" else ["--out", out])), "unrecognized arguments", *words)
    assert not out.exists()


@pytest.mark.parametrize("argv, words", [
    (["train", "--train", "TEXT", "--out", "OUT"], ["the following arguments are required: --text", "--train: now --text"]),
    (["embed", "--model", "TINY", "--input", "TEXT", "--output-dir", "OUT"],
     ["required: --text, --out", "--input: now --text", "--output-dir: now --out"]),
    (["export", "onnx", "--onnx", "TINY", "--out", "OUT"], ["required: --model", "--onnx: now --model"]),
])
def test_an_older_spelling_of_a_required_flag_is_named_with_the_missing_one(tiny_dir, text, tmp_path, argv, words):
    """argparse's "required" error comes before the unknown flags are looked at: it carries their notes too."""
    out = tmp_path / "out"
    argv = [str(tiny_dir) if a == "TINY" else str(text) if a == "TEXT" else str(out) if a == "OUT" else a for a in argv]
    _refused(run_cli(*argv), *words)
    assert not out.exists()


def test_export_onnx_refuses_a_file_for_its_folder(tiny_dir, tmp_path, text):
    before = text.read_bytes()
    _refused(run_cli("export", "onnx", "--model", tiny_dir, "--out", text), str(text), "is a file")
    assert text.read_bytes() == before
    export = tmp_path / "export"
    for _ in range(2):  # a new folder, then the export it holds replaced
        r = run_cli("export", "onnx", "--model", tiny_dir, "--out", export)
        assert r.returncode == 0, r.stderr


def test_serve_names_the_address_it_cannot_listen_on(tiny_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        _refused(run_cli("serve", "--model", tiny_dir, "--quiet", "--port", port), f"--port {port}",
                 "another process listens there")
    _refused(run_cli("serve", "--model", tiny_dir, "--quiet", "--host", "192.0.2.1", "--port", 0),
             "--host 192.0.2.1", "not an address of this machine")  # TEST-NET-1: no machine's own
