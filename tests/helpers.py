"""What many tests share: tiny model options, random model directories, sample sentences, and
where the original TensorFlow reference fixture lives. Fixtures are in ``tests/conftest.py``."""
from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch

from elmo_core import BiLM, ElmoConfig
from elmo_core.init import init_bilm
from elmo_core.lstm import BiLstmStack
from formats import save_model

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "elmo_tf_reference"
ROOT = Path(__file__).resolve().parents[1]

TINY_OPTIONS = {
    "lstm": {"dim": 24, "projection_dim": 8, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4], [2, 8], [3, 8]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
}


def tiny_options(**overrides) -> dict:
    """TINY_OPTIONS with 'lstm.x' / 'char_cnn.x' keys overridden."""
    opts = copy.deepcopy(TINY_OPTIONS)
    for key, value in overrides.items():
        section, name = key.split("__")
        opts[section][name] = value
    return opts


def make_model_dir(path: Path, options: dict, seed: int = 0, fmt: str = "hdf5", lstm_scale: float = 1.0) -> Path:
    """A random model in ``path``; ``lstm_scale`` > 1 drives cells and projections past the clips."""
    model = init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=seed)
    with torch.no_grad():  # random biases too, so every parameter matters
        for w in (model.lstm.w_input, model.lstm.w_state, model.lstm.w_proj):
            w.mul_(lstm_scale)
        g = torch.Generator().manual_seed(seed + 1)
        model.lstm.bias.normal_(0, 0.5, generator=g)
        model.encoder.proj_bias.normal_(0, 0.5, generator=g)
        model.encoder.convs[0].bias.normal_(0, 0.5, generator=g)
    save_model(model, path, fmt)
    return path


SENTENCES = [
    "The cat sat on the mat .".split(),
    ["Hi"],
    "A much longer sentence , with punctuation and numbers like 1 , 2 and 1790 in it .".split(),
    ["Café", "naïve", "日本語", "😀", "x" * 70],
    "Short one".split(),
]


def assert_as_accurate(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor, low: torch.dtype,
                       lstm: BiLstmStack, steps: int) -> None:
    """Two inference paths of the LSTM stack (``got``, ``want``), products in ``low``, against the
    float64 result ``ref`` of the same maths on the same fp32 input.

    fp32: each path within ``gamma(n) * max |ref|`` of ``ref`` (gamma(n) = n u / (1 - n u), u =
    2**-24), n = L x steps x (2P + C + 3): an output is the end of at most L x ``steps`` sequential
    LSTM steps, each two sums in a row (the gates' 2P + 1 terms with the bias, the projection's C),
    rounded in fp32 in whatever order the CPU's kernels choose. This is the first-order bound of a
    recurrence whose steps do not amplify errors (the gates saturate and the clips cut); on a Xeon
    with AVX-512 and AMX both paths stay under 5 % of it. Neither path is held to the
    other: which one is closer to ``ref`` depends on the kernels' summation order.

    bf16 / fp16: the products' inputs are rounded to ``low`` in both paths, and that rounding
    (2**-8 for bf16) dominates the fp32 accumulation differences between the paths (2**-24); so
    ``got``'s error may be at most twice ``want``'s, plus 8 of ``low``'s unit roundoffs at the
    output's scale. A wrong state, step or mask gives errors of the output's own size, far outside
    either bound."""
    ref = ref.double()
    scale = float(ref.abs().max())
    err_got, err_want = float((got.double() - ref).abs().max()), float((want.double() - ref).abs().max())
    if low == torch.float32:
        cfg = lstm.cfg
        n = cfg.n_layers * steps * (2 * cfg.projection_dim + cfg.dim + 3)
        u = 2.0 ** -24
        bound = n * u / (1 - n * u) * scale
        assert max(err_got, err_want) <= bound, f"errors {err_got:.3g} / {err_want:.3g} against float64 > {bound:.3g}"
        return
    unit = float(torch.finfo(low).eps) / 2  # unit roundoff: 2**-8 bf16, 2**-11 fp16
    bound = 2 * err_want + 8 * unit * scale
    assert err_got <= bound, f"error {err_got:.3g} against float64 > {bound:.3g} (2 x {err_want:.3g} + 8 ulp)"


def swap_weights(model: Path, other: Path) -> None:
    """Replace ``model``'s weights by ``other``'s, as ``mv`` does: a new file under the name."""
    shutil.copy(other / "weights.hdf5", model / ".weights.new")
    os.replace(model / ".weights.new", model / "weights.hdf5")


def check_a_model_swapped_after_planning(tmp_path: Path, monkeypatch, engine: list[str],  # type: ignore[no-untyped-def]
                                         resume_engine: list[str]) -> None:
    """An ``elmo embed`` under ``engine``'s flags whose model's weights are replaced between the
    driver's planning and the workers' load: exit 2 naming the model, nothing committed; with the
    job's weights back, ``--resume`` under ``resume_engine``'s flags finishes every row."""
    import pipelines.job as job_module
    from corpora.sample import write_sample_corpus
    from pipelines.verify import verify_output

    model = make_model_dir(tmp_path / "model", TINY_OPTIONS)  # a path no worker has loaded
    other = make_model_dir(tmp_path / "other", TINY_OPTIONS, seed=7)
    shutil.copy(model / "weights.hdf5", tmp_path / "job-weights.hdf5")
    write_sample_corpus(tmp_path / "corpus", rows=80, files=1)
    plan, out = job_module.plan_job, tmp_path / "out"

    def plan_then_swap(*args, **kwargs):  # type: ignore[no-untyped-def]
        job = plan(*args, **kwargs)
        swap_weights(model, other)
        return job

    monkeypatch.setattr(job_module, "plan_job", plan_then_swap)
    args = ["embed", "--text", tmp_path / "corpus", "--out", out, "--model", model, "--rows-per-shard", "40", "--quiet"]
    r = run_cli(*args, *engine)
    assert r.returncode == 2 and f"the model {model.resolve()} is not the one recorded when the run started" in r.stderr
    assert "restore its files, then rerun with --resume" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list(out.glob("part-*")) and not list((out / "_shards").glob("part-*"))
    monkeypatch.setattr(job_module, "plan_job", plan)
    os.replace(tmp_path / "job-weights.hdf5", model / "weights.hdf5")
    r = run_cli(*args, *resume_engine, "--resume")
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 80


def run_cli(*args: object) -> subprocess.CompletedProcess:
    """``elmo ARGS`` in this process (``elmo_cli.main``): its exit status, stdout and stderr as
    ``subprocess.run`` gives them, without a second interpreter importing torch (seconds each). The
    threads and signal handlers a command sets are put back. Where the process itself is under test
    (signals, a native library that could crash it) tests run ``python -m elmo_cli`` instead."""
    from elmo_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    threads, handlers = torch.get_num_threads(), {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own errors
        code = e.code if isinstance(e.code, int) else 2
    finally:
        torch.set_num_threads(threads)
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess([sys.executable, "-m", "elmo_cli", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def read_record(path: Path) -> dict:
    """An ``elmo embed`` side record (``_job.parquet``, ``_manifest.arrow``, ``_shards/part-*``)."""
    from pipelines.output_dir import LocalDir
    return LocalDir(Path(path).parent).read_record(Path(path).name)


def write_record(path: Path, record: dict) -> None:
    """Replace the side record ``path`` holds (a job's own, its schema kept; else a foreign job's with
    no columns), as another writer might."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq
    from pipelines.output_dir import LocalDir

    path = Path(path)
    schema = pa.schema([])
    if path.is_file():
        schema = pq.read_schema(path) if path.suffix == ".parquet" else ipc.open_file(path).schema
    LocalDir(path.parent).write_record(path.name, record, schema)


_WRITER = """
import sys
from storage.atomic import atomic_dir, atomic_path
kind, path = sys.argv[1:]
with (atomic_path(path) if kind == "file" else atomic_dir(path, "done")) as tmp:
    (tmp / "done" if kind == "dir" else tmp).write_text("theirs")
    print(tmp, flush=True)
    sys.stdin.read()  # until the test closes its stdin, or kills it
"""


def writer_inside(spawn, kind: str, path: Path,  # type: ignore[no-untyped-def]
                  prefix: tuple = ()) -> tuple[subprocess.Popen, Path]:
    """A real process writing ``path`` through ``storage.atomic`` (``kind`` "file": ``atomic_path``,
    "dir": ``atomic_dir`` with its ``done`` file), stopped inside the block with its temporary made
    and written, until its stdin is closed: (the process, its temporary). ``prefix``: a command
    that runs it (``unshare ...``)."""
    proc = spawn([*prefix, sys.executable, "-c", _WRITER, kind, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    assert line, f"the writer of {path} exited ({proc.wait()}) before its temporary was made"
    return proc, Path(line.strip())


def killed_inside(spawn, kind: str, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The temporary a writer of ``path`` (``writer_inside``) leaves when SIGKILL ends it inside the
    block; the process is reaped (its pid is free)."""
    proc, tmp = writer_inside(spawn, kind, path)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL and tmp.exists()
    return tmp
