"""Numbers `elmo export` and `elmo engine` take, refused where the export's record is made
(``ExportSpec``, ``TritonOptions``) with the flag named, before `--out` is created (issue 54, B1): a
gamma or mix weight that is not finite or outside float32's range would write a graph of NaNs (or,
validated, end in a parity failure naming nothing) and leave a file in `--out`."""
from __future__ import annotations

import pytest

from tests.helpers import run_cli


@pytest.mark.parametrize("validate", [["--no-validate"], []], ids=["no-validate", "validated"])
@pytest.mark.parametrize("flags, named", [
    (["--gamma", "nan"], "--gamma must be a finite number with |gamma| <= 3.40282e+38 (the largest float32), got nan"),
    (["--gamma", "inf"], "--gamma must be a finite number"),
    (["--gamma", "1e308"], "--gamma must be a finite number"),
    (["--mix", "nan,0,0"], "--mix[0] must be a finite number within float32's range"),
    (["--mix", "0,1e39,0"], "--mix[1] must be a finite number within float32's range"),
])
def test_export_onnx_refuses_a_non_finite_mix_before_out_is_created(tiny_dir, tmp_path, flags, named, validate):
    out = tmp_path / "out"
    r = run_cli("export", "onnx", "--model", tiny_dir, "--out", out, "--output", "mixed", *flags, *validate)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, named", [
    (["export", "onnx", "--gamma", "2"], "--gamma only applies to the mix (--output mixed), not to --output all"),
    (["export", "onnx", "--threads", "-1"], "--threads must be an integer from 0 to 4096"),
    (["export", "triton", "--threads", "-1"], "--threads must be an integer from 0 to 4096"),
    (["export", "triton", "--max-batch-size", str(2**40)], "--max-batch-size must be a positive integer (at most "
                                                           "2147483647)"),
    (["export", "triton", "--max-wait-ms", "-1"], "--max-wait-ms must be a finite number in [0, 60000] ms"),
    (["engine", "--threads", "-1"], "--threads must be an integer from 0 to 4096"),
    (["engine", "--max-minutes", "nan"], "--max-minutes must be a finite number in (0, 10000000], got nan"),
])
def test_export_flags_out_of_range_exit_2_before_out_is_created(tiny_dir, tmp_path, args, named):
    out = tmp_path / "out"
    r = run_cli(*args, "--model", tiny_dir, "--out", out)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()



def test_export_out_is_new_empty_or_an_earlier_export_and_replaced_only_once_one_passed(tiny_dir, tmp_path):
    """A user's folder, the model's own directory and the current directory (--out "") were written
    into, exit 0; a re-export that failed deleted the earlier export's manifest and overwrote its
    graph."""
    import json
    import shutil

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.onnx").write_text("my own graph")
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    for out in (mine, model):
        before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
        r = run_cli("export", "onnx", "--model", model, "--out", out, "--threads", "1")
        assert r.returncode == 2 and "holds files and is not an earlier export (no manifest.json)" in r.stderr, r.stderr
        assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    out = tmp_path / "export"
    assert run_cli("export", "onnx", "--model", model, "--out", out, "--threads", "1").returncode == 0
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    r = run_cli("export", "onnx", "--model", model, "--out", out, "--threads", "1", "--precision", "bf16")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # ONNX Runtime runs no bf16 graph on a CPU
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier  # the earlier export, whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    r = run_cli("export", "onnx", "--model", model, "--out", out, "--threads", "1", "--output", "mixed", "--gamma", "20")
    assert r.returncode == 0, r.stderr  # replaced; its tolerance scaled by |gamma| (was refused at 1.5e-4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["gamma"] == 20 and manifest["parity"]["tolerance"]["max_abs"] == pytest.approx(2e-3)


def test_an_edited_export_manifest_is_refused_not_obeyed(tiny_dir, tmp_path):
    """A mix weight edited in the manifest ran the graph as before and reported the edited mix (max
    |diff| 5.4 against torch, exit 0); a section deleted was a KeyError traceback."""
    import json

    out = tmp_path / "mixed"
    assert run_cli("export", "onnx", "--model", tiny_dir, "--out", out, "--output", "mixed", "--mix", "0,1,2",
                   "--threads", "1").returncode == 0
    path, text = out / "manifest.json", tmp_path / "in.txt"
    text.write_text("The cat sat .\n")
    kept = path.read_text()
    for edit in (lambda m: m["spec"].update(mix_weights=[0, 0, 10]), lambda m: m.pop("source")):
        manifest = json.loads(kept)
        edit(manifest)
        path.write_text(json.dumps(manifest))
        r = run_cli("embed", "--text", text, "--out", tmp_path / "o", "--model", out,
                    "--output", "mixed", "--mix", "0,0,10")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "edited after the export" in r.stderr and "re-export" in r.stderr, r.stderr


def test_a_mixed_export_is_refused_for_triton_and_nothing_is_left(tiny_dir, tmp_path):
    """The repository was written (exit 0), and its model refused every request (it asks for the
    mix of every layer); a failure left a partial repository that a rerun found "exists"."""
    mixed = tmp_path / "mixed"
    assert run_cli("export", "onnx", "--model", tiny_dir, "--out", mixed, "--output", "mixed",
                   "--threads", "1").returncode == 0
    r = run_cli("export", "triton", "--model", mixed, "--backend", "onnx", "--out", tmp_path / "repo")
    assert r.returncode == 2 and "a mixed export (--output mixed) gives one fixed mix" in r.stderr, r.stderr
    assert not (tmp_path / "repo" / "elmo").exists()
    r = run_cli("export", "triton", "--model", tmp_path / "nowhere", "--out", tmp_path / "repo")
    assert r.returncode == 2 and not (tmp_path / "repo" / "elmo").exists(), r.stderr
    r = run_cli("export", "triton", "--model", mixed, "--backend", "onnx", "--weights", tiny_dir / "weights.hdf5",
                "--out", tmp_path / "repo")  # an export has no weights to choose: refused, not ignored
    assert r.returncode == 2 and "--weights" in r.stderr and "no weights to choose" in r.stderr, r.stderr
    assert not (tmp_path / "repo" / "elmo").exists()
    assert run_cli("export", "triton", "--model", tiny_dir, "--out", tmp_path / "repo").returncode == 0
    assert (tmp_path / "repo" / "elmo" / "config.pbtxt").is_file()


def test_info_on_an_export_whose_graph_is_missing_or_changed_says_so(tiny_dir, tmp_path):
    """It showed "parity passed" (exit 0) for a model.onnx truncated or removed."""
    out = tmp_path / "export"
    assert run_cli("export", "onnx", "--model", tiny_dir, "--out", out, "--threads", "1").returncode == 0
    assert run_cli("info", "--model", out).returncode == 0
    data = (out / "model.onnx").read_bytes()
    (out / "model.onnx").write_bytes(data[: len(data) // 2])
    r = run_cli("info", "--model", out)
    assert r.returncode == 2 and "model.onnx: sha256" in r.stderr and "re-export" in r.stderr, r.stderr
    (out / "model.onnx").unlink()
    r = run_cli("info", "--model", out)
    assert r.returncode == 2 and "model.onnx: missing (named in manifest.json)" in r.stderr, r.stderr


def test_export_out_dot_is_its_folder(tiny_dir, tmp_path, monkeypatch):
    """`--out .` (an empty current folder) was a ValueError traceback."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert run_cli("export", "onnx", "--model", tiny_dir, "--out", ".", "--threads", "1").returncode == 0
    assert (tmp_path / "here" / "manifest.json").is_file()
