"""Everything a GPU is for, one command: the first thing to run on a machine with an NVIDIA GPU.

    python bench/gpu_check.py [--out DIR] [--only model_alone,embed] [--device cuda]
    python bench/gpu_check.py --device cpu      # dry run: every step small on the CPU (each exits 0)
    make gpu-check

Each step runs in its own process under a timeout (``TIMEOUTS``) and prints one JSON line; a step
that fails or times out is reported and the next one runs. On an H200 the whole check took 6.6
minutes (2026-11-27, one step at its limit); every step at its limit would take 10.8.

- ``parity``: ``pytest tests/gpu``: every layer, the fused steps and the rows on CUDA against CPU fp32;
- ``model_alone``: ``Embedder.embed_sentences`` fused (static rows, CUDA graphs) vs unfused (eager
  steps, ``packed``) at three batch budgets, bf16, on 32,768 sotu sentences (~450k tokens: several
  batches of the largest), with the cosine of the first 2,048 sentences' vectors against CPU fp32;
- ``embed``: ``elmo embed --device cuda`` at its defaults on a generated Parquet corpus (sotu sample);
- ``train``: training tokens/s of the published config, fused steps (``--compile``) and unfused (the
  default), and the default's kernel and host profile (bench/bench_gpu_train.py);
- ``serve``: ``elmo serve`` against ``embed_sentences`` (bench/bench_serve.py);
- ``kernels``: kernels a recurrent step launches, counted by the CUDA profiler (a row window's steps);
- ``host_waits``: the host's waits for the device over one batch of ``embed_sentences``
  (``torch.cuda.set_sync_debug_mode``; a CPU has no such waits to count).

Writes ``gpu_check.json`` and ``gpu_check.md`` to ``--out`` (default ``$OUT`` if set, else ``gpu_check/``).
Exit 0 when every step exited 0.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import elmo_core  # noqa: E402,F401  before torch (every step's process too): the environment torch reads

STEPS = ("parity", "model_alone", "embed", "train", "serve", "kernels", "host_waits")
TIMEOUTS = {"parity": 90, "model_alone": 180, "embed": 75, "train": 150, "serve": 60, "kernels": 45, "host_waits": 45}
CPU_SLACK = 3  # the dry run's timeouts: a CPU's process start and imports weigh more than its small sizes
#          (GPU, CPU dry run): full size on a GPU, the tests' tiny config on a CPU
SIZES = {"budgets": ((16_384, 65_536, 131_072), (256, 512, 1024)), "sentences": (32_768, 48), "reference": (2048, 16),
         "corpus_rows": (50_000, 200), "train_batch": (128, 4), "train_steps": (15, 2), "requests": (64, 6)}


def size(name: str, device: str):  # noqa: ANN201
    return SIZES[name][0 if device.startswith("cuda") else 1]


def tiny_options() -> dict:
    """The CPU dry run's architecture (the tests' tiny biLM) and training settings."""
    return {"lstm": {"dim": 32, "projection_dim": 16, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                     "use_skip_connections": True},
            "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
                         "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
            "dropout": 0.1, "batch_size": 8, "unroll_steps": 10, "n_negative_samples_batch": 64}


def write_inputs(work: Path, device: str) -> dict:
    """The model (random weights: full size on a GPU) and the Parquet corpus every step shares."""
    from bench.bench_onnx import FULL
    from corpora.sample import write_sample_corpus
    from elmo_core import BiLM, ElmoConfig
    from elmo_core.init import init_bilm
    from formats import save_model

    options = FULL if device.startswith("cuda") else tiny_options()
    model = work / "model"
    if not (model / "options.json").is_file():
        save_model(init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0), model)
    corpus = work / "corpus"
    if not corpus.is_dir():
        write_sample_corpus(corpus, rows=size("corpus_rows", device), files=2)
    return {"model": str(model), "corpus": str(corpus)}


# ---- the steps (each in its own process) --------------------------------------------------------
def step_parity(work: Path, device: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu"],
                         capture_output=True, text=True, cwd=ROOT)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
    if out.returncode not in (0, 5):
        raise RuntimeError(f"tests/gpu failed: {summary}\n{out.stdout[-3000:]}")
    return {"summary": summary, "passed": out.returncode == 0}


def step_model_alone(work: Path, device: str) -> dict:
    from bench.bench_onnx import accuracy, bench_sentences, timed_alternating
    from inference.batching import BatchPolicy
    from inference.embedder import Embedder
    from inference.row_shape import RowShape

    sentences = bench_sentences(size("sentences", device))  # several batches of the largest budget
    tokens, n_ref = sum(map(len, sentences)), size("reference", device)
    model = work / "model"
    with Embedder.open(model, "torch", device="cpu", precision="fp32") as cpu:  # the first sentences' vectors
        ref = cpu.embed_sentences(sentences[:n_ref], output="mixed")
    cuda = device.startswith("cuda")
    # a CPU dry run leaves the fused layout out: torch.compile's CPU kernels take minutes to build
    precision, layouts = ("bf16", {"fused": "rows", "unfused": "packed"}) if cuda else ("fp32", {"unfused": "packed"})
    figures = {}
    for budget in size("budgets", device):
        # as a job plans them (``BatchBudget.policy``): the rows layout's batches planned for its rows
        runners = {name: Embedder.open(model, "torch", device=device, precision=precision, layout=lay,
                                       policy=BatchPolicy(max_tokens_per_batch=budget,
                                                          rows=RowShape() if lay == "rows" else None))
                   for name, lay in layouts.items()}
        try:
            best = timed_alternating({k: (e, lambda: None) for k, e in runners.items()}, sentences, None, 2)
        finally:
            for e in runners.values():
                e.close()
        for name, (seconds, got) in best.items():
            figures[f"{name}@{budget}"] = {"tokens_per_s": tokens / seconds, **accuracy(got[:n_ref], ref)}
    return {"precision": precision, "tokens": tokens, "figures": figures}


def step_embed(work: Path, device: str) -> dict:
    out_dir = work / "vectors"
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(work / "corpus"), "--out", str(out_dir), "--model",
           str(work / "model"), "--device", device, "--json"]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"elmo embed exited {run.returncode}: {run.stderr[-3000:]}")
    report = json.loads(run.stdout)
    tokens = report.get("tokens") or report.get("stats", {}).get("tokens")
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s_wall": tokens / wall if tokens else None,
            "run": report.get("run"), "report": {k: v for k, v in report.items() if k != "run"}}


def step_train(work: Path, device: str) -> dict:
    from bench.bench_gpu_train import worker, write_train_inputs

    inputs = write_train_inputs(work / "train", None if device.startswith("cuda") else tiny_options())
    fused = "bf16" if device.startswith("cuda") else "fp32"  # a CPU trains unfused either way (no --compile)
    return {name: worker(inputs, variant, size("train_batch", device), size("train_steps", device),
                         profile=name == "unfused", device=device)  # elmo train --device cuda's default
            for name, variant in (("fused", fused), ("unfused", f"{fused}-unfused"))}


def step_serve(work: Path, device: str) -> dict:
    n = size("requests", device)
    cmd = [sys.executable, "bench/bench_serve.py", "--device", device, "--requests", str(n), "--clients", "4",
           "--repeats", "1", "--overload-s", "0", "--model", str(work / "model")]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(f"bench_serve exited {run.returncode}: {run.stderr[-3000:]}")
    lines = run.stdout.strip().splitlines()
    return {"throughput": next((ln for ln in lines if ln.startswith("throughput")), None),
            "latency": next((ln for ln in lines if ln.startswith("latency")), None), "output": lines[-6:]}


def step_kernels(work: Path, device: str, rows: int = 8) -> dict:
    """Kernels per recurrent step of a row window of ``rows`` rows (one layer, both directions), from
    the profiler: CUDA kernels on a GPU; on a CPU the compute ops (bench/gpu_proxy.py's count)."""
    import torch

    from bench.gpu_proxy import full_size_stack, row_step_costs
    from elmo_core.fused_cell import FusedCell
    from inference.fused_lstm import FusedLstm
    from inference.row_lstm import RowLstm, RowShape, keep_buffer

    options = json.loads((work / "model" / "options.json").read_text())
    model = full_size_stack(options)
    if not device.startswith("cuda"):
        with torch.inference_mode():
            kernels, _ = row_step_costs(FusedLstm(model.lstm, directions=False), rows=rows)  # as CUDA: one thread
        return {"kernels_per_step": kernels, "counted": "CPU compute ops of the eager fused step (no CUDA here; "
                                                        "python bench/bench_gpu.py --proxy counts the compiled ones)"}
    model = model.to(device)
    lstm, cfg = FusedLstm(model.lstm, kernels=FusedCell.compile()), model.lstm.cfg
    L = cfg.n_layers

    def window(steps: int) -> None:
        shape = RowShape(rows, steps)
        RowLstm(lstm, shape).window(torch.randn(2, steps * rows, cfg.projection_dim, device=device),
                                    keep_buffer(shape, device), torch.full((L + 1,), 1 / (L + 1), device=device))

    with torch.inference_mode():  # the difference of 8 and 4 steps: what runs once a window is not a step's
        eight, four = cuda_kernels(lambda: window(8)), cuda_kernels(lambda: window(4))
    per_step = {name: (eight.get(name, 0) - four.get(name, 0)) / 4 / L for name in eight.keys() | four.keys()}
    return {"kernels_per_step": sum(per_step.values()), "counted": "CUDA kernels (torch.profiler, ProfilerActivity.CUDA)",
            "by_kernel": dict(sorted(((name, n) for name, n in per_step.items() if n), key=lambda kv: -kv[1]))}


def cuda_kernels(run) -> dict[str, int]:  # noqa: ANN001
    """CUDA kernels ``run`` launches (after a warm-up run), by name, from the CUDA profiler."""
    import collections

    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return dict(collections.Counter(e.name for e in prof.events() if e.device_type.name == "CUDA"))


def step_host_waits(work: Path, device: str) -> dict:
    """Waits the host makes for the device over one batch of ``embed_sentences``, warned by torch."""
    import torch

    from bench.bench_onnx import bench_sentences
    from inference.embedder import Embedder

    sentences = bench_sentences(size("reference", device))
    with Embedder.open(work / "model", "torch", device=device) as emb:
        emb.embed_sentences(sentences, output="mixed")  # warm-up: graphs captured, kernels compiled
        if not device.startswith("cuda"):
            return {"host_waits_per_batch": None, "counted": "nothing: a CPU has no device to wait for"}
        one = sentences[: max(1, emb.policy.max_tokens_per_batch // max(map(len, sentences)))]  # one batch's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                emb.embed_sentences(one, output="mixed")
            finally:
                torch.cuda.set_sync_debug_mode("default")
    said = [str(w.message).splitlines()[0] for w in caught]
    syncs = [m for m in said if "synchroniz" in m and "prototype feature" not in m]  # not torch's notice of the mode
    return {"host_waits_per_batch": len(syncs), "sentences": len(one), "first": syncs[:5],
            "counted": "torch.cuda.set_sync_debug_mode('warn') over one batch (a prototype: it does not see every "
                       "wait, e.g. an event's synchronize)"}


# ---- the driver ---------------------------------------------------------------------------------
def run_step(name: str, work: Path, device: str) -> dict:
    """One step in its own process under its timeout: its JSON line, or why there is none."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--device", device, "--work", str(work)]
    limit = TIMEOUTS[name] * (1 if device.startswith("cuda") else CPU_SLACK)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)  # its own group: a timeout ends its servers and workers too
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"rc": 124, "wall_s": round(time.perf_counter() - t0, 1), "error": f"timed out after {limit} s"}
    res = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1)}
    if proc.returncode == 0:
        res["result"] = json.loads(stdout.strip().splitlines()[-1])
    else:
        res["error"] = stderr[-3000:]
    return res


def markdown(report: dict) -> str:
    lines = [f"# gpu_check on {report['device']} ({report['device_name']}), torch {report['torch']}", "",
             "| step | exit | seconds | result |", "|---|---|---|---|"]
    for name, r in report["steps"].items():
        what = summary(r["result"]) if r["rc"] == 0 else (r.get("error", "").strip().splitlines() or [""])[-1]
        lines.append(f"| {name} | {r['rc']} | {r['wall_s']} | `{what}` |")
    return "\n".join(lines) + "\n"


def summary(result: dict) -> str:
    """A step's result in a table cell: each variant's figures where it has several (``train``),
    without their profiles; else its first 300 characters."""
    if isinstance(result, dict) and result and all(isinstance(v, dict) and "tokens_per_s" in v for v in result.values()):
        return "; ".join(f"{k}: " + json.dumps({f: v for f, v in r.items() if f != "profile"}) for k, r in result.items())
    return json.dumps(result)[:300]


def default_out() -> Path:
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else Path("gpu_check")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cuda:N; cpu: a dry run, every step small")
    ap.add_argument("--out", type=Path, default=None, help="report directory (default: $OUT if set, else gpu_check/)")
    ap.add_argument("--only", help=f"comma-separated steps (default: all of {','.join(STEPS)})")
    ap.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help="the model, corpus and vectors the steps share (default: OUT/work; "
                                              "a lent machine's $OUT should hold only the report)")
    a = ap.parse_args()
    if a.step:
        print(json.dumps(globals()[f"step_{a.step}"](a.work, a.device), default=str))
        return 0
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu runs the dry run",
              file=sys.stderr)
        return 2
    steps = STEPS if not a.only else tuple(s for s in STEPS if s in a.only.split(","))
    out = (a.out or default_out()).resolve()
    work = a.work or out / "work"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    write_inputs(work, a.device)
    report = {"device": a.device, "torch": torch.__version__, "steps": {},
              "device_name": torch.cuda.get_device_name(a.device) if a.device.startswith("cuda") else "cpu dry run"}
    for name in steps:
        print(f"gpu_check: {name} ...", flush=True)
        report["steps"][name] = r = run_step(name, work, a.device)
        print(f"gpu_check: {name}: exit {r['rc']} in {r['wall_s']} s", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))  # after each step: a
        (out / "gpu_check.md").write_text(markdown(report))  # run cut short keeps the steps it finished
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if all(r["rc"] == 0 for r in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
