from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_cli.main import main
from tests.processes import WAIT_S, wait_until
from tests.helpers import read_record


def test_info_prints_architecture_and_parameter_count(fixture_dir, capsys):
    assert main(["info", "--model", str(fixture_dir / "options.json"), "--weights", str(fixture_dir / "lm_weights.hdf5"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # Summed by hand from the hdf5 shapes: char_embed 1,044 + CNN 2,188 + highway 62,000 + proj 2,000 + LSTM 37,888.
    assert info["parameters"]["total"] == 105120
    assert info["architecture"]["lstm"]["dim"] == 64 and info["output_layers"] == 3


def test_info_on_a_bad_model_exits_2_with_a_message(tmp_path):
    r = subprocess.run([sys.executable, "-m", "elmo_cli", "info", "--model", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "no options.json" in r.stderr


def test_console_script_is_installed(tiny_dir):
    elmo = Path(sys.executable).parent / "elmo"
    r = subprocess.run([str(elmo), "info", "--model", str(tiny_dir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "params" in r.stdout and "2 layers, cell 24, projection 8" in r.stdout


def test_a_signal_during_imports_exits_cleanly(tiny_dir, tmp_path, spawn):
    """Ctrl-C or SIGTERM while the command's modules are still importing (torch takes ~1 s) or just
    after: a one-line message and the signal's exit code, no traceback. The command (a job of
    several seconds) cannot end before the signal arrives. Several moments: an interruption inside a
    third-party import can leave a half-imported numpy behind (an AttributeError traceback).

    The moments count from when ``elmo`` has taken SIGTERM over (its handler shows in the process's
    caught-signal mask): before the interpreter runs the package's first line, Python's own default
    applies, which no program can change (seen at 0.05 s after the start on a slow AMD EPYC)."""
    import signal
    import time

    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=3000, files=1)
    interrupt, terminate = (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")
    for delay, (sig, code, word) in zip((0.0, 0.0, 0.2, 0.5, 0.9), (interrupt, terminate) * 3):
        proc = spawn([sys.executable, "-m", "elmo_cli", "embed", "--text", str(tmp_path / "corpus"),
                      "--out", str(tmp_path / f"out-{code}-{delay}"), "--model", str(tiny_dir), "--threads", "1",
                      "--max-batch-tokens", "300", "--quiet"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _until_it_catches(proc, signal.SIGTERM)
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == code and word in err and "Traceback" not in err, (sig, delay, proc.returncode, err)


def _until_it_catches(proc: subprocess.Popen, sig: int) -> None:
    """Wait until ``proc`` has a handler for ``sig`` (the SigCgt mask of /proc/PID/status)."""
    def caught() -> bool:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        return bool(int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
                    >> (sig - 1) & 1)

    wait_until(caught, f"process {proc.pid} installed a handler for signal {sig}", proc=proc, poll=0.002)


def test_demo_with_another_model_in_the_same_work_dir(tiny_dir, tmp_path, capsys):
    from tests.helpers import make_model_dir, tiny_options

    other = make_model_dir(tmp_path / "other", tiny_options(), seed=1)
    for model in (tiny_dir, other, tiny_dir):  # each model its own vectors; the first is resumed, not redone
        assert main(["demo", "--work-dir", str(tmp_path / "demo"), "--model", str(model), "--rows", "300"]) == 0
    assert len(list((tmp_path / "demo").glob("sentences-*"))) == 2
    out, err = capsys.readouterr()
    # another --rows is another corpus (it printed the new count and embedded the 300 rows kept)
    assert main(["demo", "--work-dir", str(tmp_path / "demo"), "--model", str(tiny_dir), "--rows", "200"]) == 0
    assert len(list((tmp_path / "demo").glob("sentences-200-*"))) == 1
    assert "200 rows" in capsys.readouterr().out
    assert "another job's output" not in err
    assert "layer 0" in out and "all words" in out and "nearest contexts of 'work'" in out  # elmo probe's report
    lines = out.strip().splitlines()
    assert lines[-7].startswith("picture ") and (tmp_path / "demo" / "probe-work.png").is_file(), lines[-7]
    query = lines[-6].split(" to: ", 1)[1]
    assert lines[-6].startswith("search  the 5 sentences of ") and "work" in query.split()
    cosines = [float(line.split()[0]) for line in lines[-5:]]
    assert cosines == sorted(cosines, reverse=True) and all(-1 <= c <= 1 for c in cosines)
    texts = [line.split(None, 1)[1] for line in lines[-5:]]
    assert query not in texts and len(set(texts)) == 5


def test_demo_without_matplotlib_says_how_to_get_the_picture(tiny_dir, tmp_path, capsys, monkeypatch):
    import probing.probe_picture

    monkeypatch.setattr(probing.probe_picture.importlib.util, "find_spec", lambda name: None)
    assert main(["demo", "--work-dir", str(tmp_path / "demo"), "--model", str(tiny_dir), "--rows", "200",
                 "--query", "We must work together ."]) == 0
    out = capsys.readouterr().out
    assert "picture not drawn: pip install 'elmo-pipeline[plot]' (matplotlib)" in out
    assert not (tmp_path / "demo" / "probe-work.png").exists() and "to: We must work together ." in out
    assert main(["probe", "--model", str(tiny_dir), "--png", str(tmp_path / "p.png")]) == 2
    assert "--png" in capsys.readouterr().err


def test_info_knows_every_directory_the_project_writes(tiny_dir, tmp_path, capsys):
    from export.build import build_for_machine
    from pipelines import embed_parquet
    from corpora.sample import write_sample_corpus

    build_for_machine(str(tiny_dir), tmp_path / "engine", threads=1)
    write_sample_corpus(tmp_path / "corpus", rows=50, files=1)
    embed_parquet(tmp_path / "corpus", tmp_path / "vectors", tiny_dir, quiet=True)
    for path, kind in [(tiny_dir, "model"), (tmp_path / "engine" / "onnx", "onnx export"),
                       (tmp_path / "engine", "elmo engine output"), (tmp_path / "vectors", "elmo embed output")]:
        assert main(["info", "--model", str(path), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["kind"] == kind, (path, info)
    assert info["rows"] == 50 and info["finished"] and info["null_rows"] == info["invalid_utf8"] == 0
    assert main(["info", "--model", str(tmp_path / "engine" / "onnx")]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert lines["precision"].split() == ["precision", "fp32"]
    assert lines["parity"].startswith("parity       passed against torch backend") and "min token cosine" in out
    assert lines["source"].startswith(f"source       {tiny_dir / 'options.json'}  +  {tiny_dir / 'weights.hdf5'} "
                                      f"(hdf5), weights sha256 ") and len(lines["source"].split()[-1]) == 64
    assert "null" not in out and lines["architecture"].endswith("1 highway")  # whole lines, nothing cut
    assert main(["info", "--model", str(tmp_path / "engine")]) == 0
    engine = capsys.readouterr().out
    assert f"onnx export: {tmp_path / 'engine' / 'onnx'}" in engine and lines["source"] in engine
    assert main(["info"]) == 2 and "make info MODEL=DIR" in capsys.readouterr().err
    assert main(["info", "--out", str(tmp_path / "vectors"), "--json"]) == 0  # what elmo embed wrote: its --out
    assert json.loads(capsys.readouterr().out) == info
    assert main(["info", "--out", str(tmp_path / "vectors"), "--model", str(tiny_dir)]) == 2
    assert "give --model or --out, not both" in capsys.readouterr().err
    for path, kind in [(tmp_path / "engine" / "onnx", "onnx export"), (tmp_path / "engine", "elmo engine output"),
                       (tmp_path / "vectors", "elmo embed output")]:  # no weights to choose: --weights is refused
        assert main(["info", "--model", str(path), "--weights", str(tiny_dir / "weights.hdf5")]) == 2
        assert f"{path} is not a model directory ({kind}), so there are no weights to choose" in capsys.readouterr().err


def test_info_describes_embed_outputs_that_are_files_and_refuses_their_records(tiny_dir, tmp_path, capsys):
    """`elmo embed --format hdf5`'s file and one shard of an OUTPUT_DIR are described from their own
    metadata (not taken for a model: "not a model directory"); the vectors' shape is the output's,
    the shard's model sha256 the job's; a side record is refused naming the directory to describe."""
    from corpora.sample import write_sample_corpus

    (tmp_path / "in.txt").write_text("The cat sat .\nIt sat on the mat .\nGo .\n")
    hdf5, out = tmp_path / "x.hdf5", tmp_path / "vectors"
    assert main(["embed", "--text", str(tmp_path / "in.txt"), "--out", str(hdf5), "--format", "hdf5", "--model",
                 str(tiny_dir), "--output", "all", "--quiet"]) == 0
    assert main(["info", "--out", str(hdf5), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "kind": "elmo embed hdf5 output", "path": str(hdf5), "sentences": 3, "keyed_by": "line index",
        "request": {"output": "all", "mix": None, "gamma": 1.0, "pool": None, "normalize": False, "dtype": "float32"},
        "vectors": {"pooled": False, "layers": 3, "dim": 16, "dtype": "float32"}}  # tiny: 2 layers of 2 x 8
    assert main(["info", "--model", str(hdf5)]) == 0
    assert "vectors            one per token, 3 layers x 16 float32" in capsys.readouterr().out.splitlines()

    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(out), "--model", str(tiny_dir), "--pool",
                 "mean", "--dtype", "float16", "--rows-per-shard", "20", "--quiet"]) == 0
    assert main(["info", "--out", str(out), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    pooled = {"pooled": True, "layers": None, "dim": 16, "dtype": "float16"}
    assert whole["vectors"] == pooled and whole["rows"] == 30
    shard = out / "part-00000-00001.parquet"
    assert main(["info", "--out", str(shard), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {k: info[k] for k in ("kind", "output_dir", "input", "row_start", "rows", "vectors", "model_sha256")} == {
        "kind": "elmo embed shard", "output_dir": str(out), "input": str(tmp_path / "corpus" / "corpus-00000.parquet"),
        "row_start": 20, "rows": 10, "vectors": pooled, "model_sha256": whole["model"]["sha256"]}
    for record in ("_job.parquet", "_manifest.parquet", "_SUCCESS"):
        assert main(["info", "--out", str(out / record)]) == 2
        assert (f"{out / record}: a record of the elmo embed OUTPUT_DIR {out}, not an output of its own: elmo info "
                f"--out {out} describes the output") in capsys.readouterr().err
    assert main(["info", "--model", str(tiny_dir / "weights.hdf5")]) == 2  # a model's weights: no output
    assert "not a model directory or options.json" in capsys.readouterr().err


def test_info_in_a_pipe_that_closes_early(tiny_dir):
    r = subprocess.run(f"{sys.executable} -m elmo_cli info --model {tiny_dir} | head -1", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("model ") and r.stderr == "", r.stderr
    # a reader that is gone before anything is written: the writes meet a closed pipe (EPIPE)
    r = subprocess.run(f"set -o pipefail; {sys.executable} -m elmo_cli info --model {tiny_dir} | true", shell=True,
                       executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_precision_auto_is_settled_printed_and_recorded(tiny_dir, tmp_path, capsys):
    from inference.model_run import resolve_run
    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=50, files=1)
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "out"), "--model", str(tiny_dir),
                 "--precision", "auto"]) == 0
    run = resolve_run(tiny_dir, precision="auto")
    want, why = run.precision, run.precision_reason
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("elmo embed: loading the model")]
    assert len(said) == 1 and said[0].startswith(f"elmo embed: loading the model {tiny_dir} (torch on cpu, {want}: "
                                                 f"{why}; 1 thread: "), said  # the run, printed once
    manifest = read_record(tmp_path / "out" / "_manifest.parquet")
    assert manifest["run"]["precision"] == want and manifest["run"]["precision_reason"] == why  # the run, once
    assert not {"precision", "precision_reason", "device", "threads", "backend"} & set(manifest["options"])
    assert not {"threads", "device"} & set(manifest["engine"])
    assert manifest["run"]["precision"] == want and manifest["run"]["model"] == str(tiny_dir.resolve())


def test_embed_reads_the_backend_from_an_export_directory(tiny_dir, tmp_path, capsys):
    from corpora.sample import write_sample_corpus
    from export.onnx_export import export_onnx

    export_onnx(str(tiny_dir), tmp_path / "exp", threads=1)
    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "exp"),
                 "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["backend"] == "onnx"
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "out2"), "--model", str(tmp_path / "exp"),
                 "--backend", "torch"]) == 2
    assert f"{tmp_path / 'exp'}: an onnx export, which the torch backend cannot run; add --backend onnx" in \
        capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
    for command in (["probe"], ["demo", "--work-dir", str(tmp_path / "demo")]):  # no --backend to add there
        assert main([*command, "--model", str(tmp_path / "exp")]) == 2
        err = capsys.readouterr().err
        assert f"an onnx export; elmo {command[0]} runs a model directory" in err and "--backend" not in err, err
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("argv, usage", [
    (["train", "--text", "t.txt", "--out", "run", "--bogus-flag"], "elmo train"),
    (["export", "onnx", "--model", "m", "--out", "e", "--bogus"], "elmo export onnx"),
])
def test_an_unknown_flag_is_refused_with_its_commands_usage(argv, usage, capsys):
    """argparse refused it at the top level (``usage: elmo [-h] [--version] COMMAND``), which
    hides the flags the command does take."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"usage: {usage} [-h]" in err, err
    assert f"{usage}: error: unrecognized arguments: {argv[-1]}" in err, err
