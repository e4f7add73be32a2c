"""Everything a GPU is for, measured in one command: the first thing to run on a GPU (docs/gpu.md).

    python bench/gpu_check.py [--device cuda] [--out DIR]     # or: make gpu-check
    python bench/gpu_check.py --device cpu                     # a dry run: every step, small, on the CPU

Each step runs in its own process under its own timeout (a step that hangs or fails is reported
with its reason; the others still run), and writes its figures; the whole check writes
``gpu_check.json`` and ``gpu_check.md`` into ``--out`` (default ``$OUT`` where set, else
``gpu_check/``). On one H100 the steps take about 6 minutes in all (the budget is 8).

Steps (the issue's targets in brackets, on an H100):
- ``model``: the model alone (``Embedder.embed_sentences``, mixed), fused steps replayed as CUDA
  graphs (the ``rows`` layout) against the eager steps (``packed``), at three batch budgets, with
  each variant's parity against the CPU reference in fp32 [bf16 >= 500k tokens/s, cosine >= 0.999];
- ``embed``: ``elmo embed --device`` at its defaults on a generated Parquet corpus, end to end
  [>= 300k tokens/s, >= 0.8x the model alone], the job's stages and device busy share;
- ``train``: ``elmo train`` steps, tokens/s at the device's default precision [>= 100k tokens/s];
- ``serve``: ``elmo serve`` over HTTP against ``embed_sentences`` on the same sentences [>= 0.8x];
- ``kernels``: kernels per recurrent step, from the profiler [<= 4];
- ``syncs``: host waits per batch (on CUDA ``torch.cuda.set_sync_debug_mode``; on a CPU the
  proxy's count, bench/host_waits.py) [<= 1].
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TIMEOUTS = {"model": 150, "embed": 120, "train": 90, "serve": 120, "kernels": 60, "syncs": 60}  # seconds, on a GPU
DRY = {"rows": 300, "budgets": (1024, 2048, 4096), "sentences": 64, "train_steps": 4}
FULL_RUN = {"rows": 50_000, "budgets": (16384, 65536, 131072), "sentences": 2048, "train_steps": 20}


def sizes(device: str) -> dict:
    return FULL_RUN if device.startswith("cuda") else DRY


def architecture(device: str) -> dict:
    from bench.bench_onnx import FULL, QUICK

    return FULL if device.startswith("cuda") else QUICK


def model_dir(work: Path, device: str) -> Path:
    from elmo_core import BiLM, ElmoConfig
    from elmo_core.init import init_bilm
    from formats import save_model

    path = work / "model"
    if not (path / "options.json").is_file():
        save_model(init_bilm(BiLM(ElmoConfig.from_dict(architecture(device))), seed=0), path)
    return path


def _timed(embedder, sentences) -> tuple[float, list]:  # type: ignore[no-untyped-def]
    import torch

    embedder.embed_sentences(sentences[:64], output="mixed")  # warm: graphs, kernels, the cache
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = embedder.embed_sentences(sentences, output="mixed")
    return time.perf_counter() - t0, out


def step_model(work: Path, device: str) -> dict:
    """Fused steps (on CUDA the rows layout, replayed as graphs) against eager ones (packed), per
    budget and precision, with parity against the CPU reference in fp32."""
    import numpy as np

    from bench.bench_onnx import accuracy, bench_sentences
    from inference.batching import BatchPolicy
    from inference.embedder import Embedder

    s = sizes(device)
    sentences, model = bench_sentences(s["sentences"]), model_dir(work, device)
    with Embedder.open(model, precision="fp32") as cpu:
        reference = cpu.embed_sentences(sentences[: s["sentences"] // 4], output="mixed")
    tokens, out = sum(map(len, sentences)), {}
    for precision in ("fp32", "bf16"):
        for layout in ("rows" if device.startswith("cuda") else "fused", "packed"):  # fused (graphs on CUDA), eager
            for budget in s["budgets"]:
                with Embedder.open(model, device=device, precision=precision, layout=layout,
                                   policy=BatchPolicy(max_tokens_per_batch=budget)) as e:
                    seconds, got = _timed(e, sentences)
                acc = accuracy(got[: len(reference)], reference)
                out[f"{precision} {layout} {budget}"] = {"tokens_per_s": round(tokens / seconds),
                                                         "min_cosine": float(np.round(acc["min_cosine"], 6)),
                                                         "max_abs": float(acc["max_abs"])}
    return out


def step_embed(work: Path, device: str) -> dict:
    """``elmo embed`` at its defaults, end to end, through the CLI."""
    from corpora.sample import write_sample_corpus

    corpus, out = work / "corpus", work / "embedded"
    if not corpus.is_dir():
        write_sample_corpus(corpus, rows=sizes(device)["rows"], files=4, row_group_rows=5000)
    r = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", str(corpus), str(out), "--model",
                        str(model_dir(work, device)), "--device", device, "--dtype", "float16", "--json", "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    m = json.loads(r.stdout)
    return {"tokens_per_s": round(m["this_run"]["tokens_per_second"]), "tokens": m["tokens"], "stages": m["stages"],
            "run": {k: m["run"][k] for k in ("precision", "precision_reason", "batch", "layout")}}


def step_train(work: Path, device: str) -> dict:
    """Training steps of the architecture at the device's default precision, after a warm-up."""
    import torch

    from host_waits import TRAIN_OPTIONS
    from corpora.sotu import sotu_sentences
    from training.options import TrainOptions
    from training.trainer import Trainer

    corpus = work / "train.txt"
    corpus.write_text("\n".join(" ".join(t) for _, (_, t) in zip(range(3000), sotu_sentences())) + "\n")
    options = {**architecture(device), **{k: v for k, v in TRAIN_OPTIONS.items() if k not in ("lstm", "char_cnn")}}
    (work / "train.json").write_text(json.dumps(options))
    trainer = Trainer(TrainOptions(train=str(corpus), options=str(work / "train.json"), out=str(work / "run"),
                                   device=device, min_count=1, checkpoint_every=0, log_every=10**6), log=lambda s: None)
    trainer.step(trainer.batcher.next_batch())
    n, steps = 0, sizes(device)["train_steps"]
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = trainer.batcher.next_batch()
        trainer.step(batch)
        n += batch.n_tokens
    trainer.flush()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"tokens_per_s": round(n / (time.perf_counter() - t0)), "steps": steps, "precision": trainer.opts.precision}


def step_serve(work: Path, device: str) -> dict:
    """bench/bench_serve.py's throughput pass, small."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_serve.py"), "--device", device, "--requests",
                        "64" if device.startswith("cuda") else "8", "--clients", "8", "--repeats", "1",
                        "--overload-s", "0", "--workdir", str(work / "serve")],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:] or r.stdout[-2000:])
    return {"report": [line for line in r.stdout.splitlines() if line.strip()][-8:]}


def step_kernels(work: Path, device: str) -> dict:
    """Kernels per recurrent step of the rows layout (both directions, one layer), fp32."""
    import torch

    from gpu_proxy import full_size_stack, row_step_costs
    from elmo_core.fused_cell import FusedCell
    from inference.fused_lstm import FusedLstm

    if not device.startswith("cuda"):
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
        with torch.inference_mode():
            kernels, passes = row_step_costs(FusedLstm(full_size_stack(architecture(device)).lstm,
                                                       kernels=FusedCell.compile()), rows=8)
        return {"kernels_per_step": kernels, "gate_passes_per_step": passes, "how": "the proxy's count on the CPU"}
    return {"kernels_per_step": cuda_kernels_per_step(architecture(device), device), "how": "torch.profiler, CUDA"}


def cuda_kernels_per_step(options: dict, device: str) -> float:
    """CUDA kernels a step launches, from the profiler: windows of 8 and 16 steps, the difference."""
    import torch

    from gpu_proxy import full_size_stack
    from elmo_core.fused_cell import FusedCell
    from inference.fused_lstm import FusedLstm
    from inference.row_lstm import RowLstm, RowShape

    model = full_size_stack(options).to(device)
    lstm, cfg = FusedLstm(model.lstm, kernels=FusedCell.compiled()), model.config.lstm

    def kernels(steps: int) -> int:
        rows = RowLstm(lstm, RowShape(128, steps))
        args = (torch.randn(2, steps * 128, cfg.projection_dim, device=device),
                torch.ones(steps + 1, 128, dtype=torch.bool, device=device),
                torch.full((cfg.n_layers + 1,), 1 / (cfg.n_layers + 1), device=device))
        rows.window(*args)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            rows.window(*args)
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    with torch.inference_mode():
        return (kernels(16) - kernels(8)) / 8 / cfg.n_layers


def step_syncs(work: Path, device: str) -> dict:
    """Host waits per batch of elmo embed's path (bench/host_waits.py on a CPU; CUDA's own count on CUDA)."""
    import warnings

    import torch

    from host_waits import batch_waits, cuda_path_backend
    from bench.bench_onnx import bench_sentences
    from elmo_core import BiLM, ElmoConfig
    from elmo_core.init import init_bilm

    sentences = bench_sentences(64)
    if not device.startswith("cuda"):
        model = init_bilm(BiLM(ElmoConfig.from_dict(architecture(device))), seed=0).eval()
        waits = batch_waits(cuda_path_backend(model), sentences)
        return {"host_waits_per_batch": waits.total, "by_kind": dict(waits.by_kind), "how": "bench/host_waits.py"}
    from inference.embedder import Embedder

    with Embedder.open(model_dir(work, device), device=device) as e:
        e.embed_sentences(sentences, output="mixed")
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                e.embed_sentences(sentences, output="mixed")
            finally:
                torch.cuda.set_sync_debug_mode("default")
    return {"host_waits_per_batch": sum("synchroniz" in str(w.message) for w in caught),
            "how": "torch.cuda.set_sync_debug_mode, one call of embed_sentences (one batch)"}


STEPS = {"model": step_model, "embed": step_embed, "train": step_train, "serve": step_serve,
         "kernels": step_kernels, "syncs": step_syncs}


def run_step(name: str, work: Path, device: str, timeout: float) -> dict:
    """One step in its own process, under ``timeout``: its figures, or why it has none."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, __file__, "--step", name, "--device", device, "--work", str(work)],
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        figures = json.loads((work / f"{name}.json").read_text()) if r.returncode == 0 else \
            {"error": (r.stderr or r.stdout)[-1500:]}
    except subprocess.TimeoutExpired:
        figures = {"error": f"timed out after {timeout:.0f} s"}
    return {"ok": "error" not in figures, "seconds": round(time.perf_counter() - t0, 1), **figures}


def markdown(report: dict) -> str:
    lines = [f"# gpu_check: {report['device']} ({report['device_name']}), {report['date']}", "",
             "| step | ok | seconds | figures |", "|---|---|---|---|"]
    for name, r in report["steps"].items():
        figures = {k: v for k, v in r.items() if k not in ("ok", "seconds")}
        lines.append(f"| {name} | {'yes' if r['ok'] else 'NO'} | {r['seconds']} | `{json.dumps(figures)[:600]}` |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a dry run, small)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check"))
    ap.add_argument("--only", help="comma-separated steps (default: all)")
    ap.add_argument("--timeout-scale", type=float, help="each step's timeout times this (default 1 on CUDA, 3 on a CPU)")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:  # one step, in its own process
        args.work.mkdir(parents=True, exist_ok=True)
        (args.work / f"{args.step}.json").write_text(json.dumps(STEPS[args.step](args.work, args.device)))
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU here: run `python bench/gpu_check.py --device cpu` for a dry run", file=sys.stderr)
        return 2
    scale = args.timeout_scale or (1.0 if args.device.startswith("cuda") else 3.0)  # a CPU runs the small steps slower
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
    report = {"device": args.device, "device_name": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "torch": torch.__version__, "steps": {}}
    for step in (args.only.split(",") if args.only else STEPS):
        report["steps"][step] = r = run_step(step, work, args.device, TIMEOUTS[step] * scale)
        print(f"{step}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s: "
              f"{json.dumps({k: v for k, v in r.items() if k not in ('ok', 'seconds')})[:400]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(f"wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'}")
    return 0 if all(r["ok"] for r in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
