"""The first thing to run on a GPU: one command measuring everything a GPU is for, each step in its
own process with its own timeout (the whole check <= 8 minutes on one GPU), one JSON and one
markdown report.

Steps (each reuses its bench; on ``--device cpu`` every step runs small on the CPU, a dry run that
checks the check itself):

  model        the model alone, fused (compiled steps, CUDA graphs) vs unfused (eager), at three
               batch budgets (bench/bench_gpu.py), with parity against the CPU reference
  embed        ``elmo embed --device DEV`` end to end at its defaults on a generated Parquet corpus
               (corpora.sample), tokens/s from the run
  train        training tokens/s and the CUDA kernels a step from the profiler (bench/bench_gpu_train.py)
  serve        ``elmo serve`` against ``embed_sentences`` on the same sentences (bench/bench_serve.py)
  host_waits   host waits per batch of ``embed_sentences`` (``torch.cuda.set_sync_debug_mode``), and
               per training step (bench/train_waits.py)

    python bench/gpu_check.py [--out DIR] [--device cuda|cpu] [--only model,embed]   # make gpu-check

The report goes to --out (default: $OUT if set, else gpu_check/): gpu_check.json, gpu_check.md and
each step's log.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BUDGETS = (16_384, 65_536, 131_072)


def steps(device: str, out: Path) -> dict[str, tuple[list[list[str]], int]]:
    """Each step's commands and its timeout in seconds (GPU sizes on cuda, small ones on the CPU)."""
    gpu = device.startswith("cuda")
    model = [[PY, "bench/bench_gpu.py", "--max-tokens-per-batch", str(b), "--sentences", "2048" if gpu else "32",
              "--repeats", "2" if gpu else "1", "--json-out", str(out / f"model-{b}.json")] + ([] if gpu else ["--quick"])
             for b in (BUDGETS if gpu else BUDGETS[:1])]
    corpus, vectors = out / "work" / "corpus", out / "work" / "vectors"
    embed = [[PY, "-c", f"from corpora.sample import write_sample_corpus; write_sample_corpus({str(corpus)!r}, "
              f"rows={50_000 if gpu else 200})"],
             [PY, "-m", "elmo_cli", "embed", str(corpus), str(vectors), "--model", str(ROOT / "models" / "default"),
              "--device", device]]
    train = [[PY, "bench/bench_gpu_train.py", "--steps", "10", "--rounds", "1"] if gpu else
             [PY, "bench/train_waits.py", "--tree", str(ROOT), "--steps", "2"]]
    serve = [[PY, "bench/bench_serve.py", "--device", device, "--repeats", "1", "--overload-s", "0",
              "--workdir", str(out / "work" / "serve")] +
             ([] if gpu else ["--model", str(ROOT / "models" / "default"), "--clients", "2", "--requests", "8"])]
    waits = [[PY, str(Path(__file__).resolve()), "--host-waits", device]]
    return {"model": (model, 240 if gpu else 300), "embed": (embed, 150 if gpu else 300),
            "train": (train, 120 if gpu else 300), "serve": (serve, 90 if gpu else 300),
            "host_waits": (waits, 60 if gpu else 300)}


def host_waits(device: str) -> None:
    """One batch of ``embed_sentences`` after a warm-up, with CUDA's sync debug mode counting the
    host waits (``warn``: each one a warning); on the CPU the batch runs and no count is taken."""
    import warnings

    import torch

    from inference.embedder import Embedder

    sentences = [f"the nation {i} has grown in strength and in number of its people".split() for i in range(64)]
    embedder = Embedder(str(ROOT / "models" / "default"), device=device)
    embedder.embed_sentences(sentences)  # warm-up: compiles and captures
    if not device.startswith("cuda"):
        embedder.embed_sentences(sentences)
        print(json.dumps({"host_waits_per_batch": None, "note": "counted on CUDA only (the CPU never waits)"}))
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            embedder.embed_sentences(sentences)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print(json.dumps({"host_waits_per_batch": sum("synchroniz" in str(w.message) for w in caught)}))


def run_step(name: str, commands: list[list[str]], timeout: int, out: Path) -> dict:
    """A step's commands in turn, each in its own process within what is left of ``timeout``."""
    t0, log = time.perf_counter(), out / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "w", encoding="utf-8") as f:
        for cmd in commands:
            left = timeout - (time.perf_counter() - t0)
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=max(left, 1)).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                break
    text = log.read_text(encoding="utf-8", errors="replace")
    return {"step": name, "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "timeout_s": timeout,
            "tail": text.strip().splitlines()[-8:], "results": _json_lines(text)}


def _json_lines(text: str) -> list:
    found = []
    for line in text.splitlines():
        if line.startswith("{") and line.endswith("}"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def markdown(report: dict) -> str:
    lines = [f"# GPU check ({report['device']})", "", f"{report['started']}, {report['seconds']:.0f} s in all.", "",
             "| step | exit | seconds | last line |", "|---|---|---|---|"]
    for s in report["steps"]:
        last = (s["tail"][-1] if s["tail"] else "").replace("|", "\\|")[:160]
        lines.append(f"| {s['step']} | {s['rc']} | {s['seconds']} | {last} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check"))
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run of every step, small)")
    ap.add_argument("--only", help="comma-separated steps (default: all)")
    ap.add_argument("--host-waits", metavar="DEVICE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host_waits:
        host_waits(a.host_waits)
        return 0
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    plan = steps(a.device, out)
    names = a.only.split(",") if a.only else list(plan)
    unknown = sorted(set(names) - set(plan))
    if unknown:
        print(f"--only {a.only}: no step {', '.join(unknown)}; the steps are {', '.join(plan)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    report = {"device": a.device, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": []}
    for name in names:
        res = run_step(name, *plan[name], out)
        report["steps"].append(res)
        print(f"{name}: exit {res['rc']} in {res['seconds']} s" + (f" -- {res['tail'][-1]}" if res["tail"] else ""),
              flush=True)
    report["seconds"] = time.perf_counter() - t0
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")
    print(f"report: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    return 0 if all(s["rc"] == 0 for s in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
