"""The host side of ``elmo embed`` alone: a model whose compute is negligible but whose output is full
width (D = 1024, three layers), so the job's own work (reading, tokens, character ids, moving and
mixing layers, Arrow, Parquet) is what is timed. Issue #20's measure: 40,000 sotu rows, mixed
output in float16; target >= 30,000 tokens/s on a 2-core CPU.

Each run is a fresh process. ``--baseline REV`` runs the same job with the code of an earlier commit
(a git worktree) in the same session, taking turns with this tree; each figure is the best of
``--repeats``. The stage seconds of this tree's best run are printed too. ``--store`` times the same
job writing OUTPUT_DIR to an S3 server on 127.0.0.1 (moto's, the ``s3test`` extra) in turns with the
local disk, and reports the store's requests per shard. A store's CPU is not the job's, so with
``--store`` every job runs on the first CPU and the server alone on the others (``taskset``-like
affinity): on a 2-core machine, each job has one core.

    python bench/bench_host.py [--rows 40000] [--repeats 2] [--dtype float16] [--threads N] [--baseline REV]
                               [--writer-threads 1,2] [--layouts parquet-floats,parquet-binary,arrow] [--store]
                               [--files 4] [--model DIR]

``--model DIR`` runs that model instead of the tiny one: a whole job, its model's stage included
(the CPU's sort windows, for one, are sized by the model's width).

Issue #53's targets (2 cores): --format arrow >= 300k tokens/s end to end; the Parquet float layout
>= 1.5x the tree before it (two writers). The tiny model's own stage bounds the first on a CPU (its
12,000-odd sequential steps of 512-wide outputs, ~6 s of 412,895 tokens on an AMX Xeon): the line
"without the model stage" gives what the host's other stages cost a core.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {"parquet-floats": {}, "parquet-binary": {"vector_layout": "binary"}, "arrow": {"format": "arrow"}}
TINY = {"lstm": {"dim": 8, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                 "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4]], "n_highway": 0, "n_characters": 262,
                     "max_characters_per_token": 50, "activation": "relu"}}
JOB = ("import json, sys; from pipelines import embed_parquet; "
       "stub = json.loads(sys.argv[7]); "
       "stub and (sys.path.insert(0, stub), __import__('no_model').install()); "
       "threads = int(sys.argv[5]) or None; "
       "m = embed_parquet(sys.argv[1], sys.argv[2], sys.argv[3], dtype=sys.argv[4], output='mixed', quiet=True, "
       "threads=threads, **json.loads(sys.argv[6])); "
       "requests = getattr(sys.modules.get('storage.locations'), 'S3_REQUESTS', {}).get('count', 0); "
       "print(json.dumps({'tokens_per_s': m['this_run']['tokens_per_second'], 'tokens': m['tokens'], "
       "'stages': m.get('stages'), 'shards': len(m['shards']), 'requests': requests, "
       "'threads': m.get('run', {}).get('threads')}))")


def prepare(work: Path, rows: int, files: int = 4) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from elmo_core import BiLM, ElmoConfig
    from formats import save_model
    from elmo_core.init import init_bilm
    from corpora.sample import write_sample_corpus

    model, corpus = work / "tiny", work / f"corpus-{rows}x{files}"
    if not (model / "options.json").is_file():
        save_model(init_bilm(BiLM(ElmoConfig.from_dict(TINY)), seed=0), model)
    if not corpus.is_dir():
        write_sample_corpus(corpus, rows=rows, files=files, row_group_rows=5000)
    return model, corpus


def run_job(tree: Path, corpus: Path, out: Path, model: Path, dtype: str, threads: int, extra: dict,
            cpus: set[int] | None = None, no_model: bool = False) -> dict:
    stub = str(ROOT / "bench") if no_model else ""
    r = subprocess.run([sys.executable, "-c", JOB, str(corpus), str(out), str(model), dtype, str(threads),
                        json.dumps(extra), json.dumps(stub)], cwd=tree, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
                       env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the job failed in {tree}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def disk_rate(directory: Path, size: int) -> float:
    """Bytes a second this directory's disk takes, ``size`` bytes (a job's output) written and
    fsynced as shards are (16 MiB writes, one fsync): the ceiling every layout meets on it, whatever
    the host's cores. A VM's disk may take a first burst at several times its sustained rate."""
    import time

    chunk, path = os.urandom(16 << 20), directory / ".disk_rate"
    count = max(1, size // len(chunk))
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(count):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return count * len(chunk) / seconds


def tree_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def start_store(cpus: set[int]) -> subprocess.Popen:
    """An S3 server on 127.0.0.1 (its own process, on ``cpus``) with a bucket ``bench``; its
    endpoint and credentials in this process's environment, which the jobs inherit."""
    import socket
    import time

    import boto3
    from botocore.exceptions import EndpointConnectionError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"})
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    for _ in range(100):
        try:
            client.create_bucket(Bucket="bench")
            return server
        except EndpointConnectionError:  # not listening yet
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the S3 server did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--files", type=int, default=4, help="input files the rows are written in")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    ap.add_argument("--baseline", help="a git revision to time in turns with this tree")
    ap.add_argument("--baseline-options", default="{}", help="the baseline job's embed options, JSON (default: its defaults)")
    ap.add_argument("--threads", type=int, default=0, help="the job's --threads (default: torch's)")
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--writer-threads", default="1,2", help="comma-separated values, each timed in turn (this tree)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help=f"comma-separated shard layouts, each timed in turn (this tree): {', '.join(LAYOUTS)}")
    ap.add_argument("--store", action="store_true", help="also write to an S3 server on 127.0.0.1, in turns")
    ap.add_argument("--model", type=Path, help="a model directory to run instead of the tiny one (e.g. models/default: "
                                               "a whole job's throughput, the model's stage included)")
    ap.add_argument("--no-model", action="store_true",
                    help="the model's compute off the host, as on a GPU (bench/no_model.py): its host part only")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_host_"))
    work.mkdir(parents=True, exist_ok=True)
    model, corpus = prepare(work, args.rows, args.files)
    model = args.model.resolve() if args.model else model
    writers = [int(w) for w in args.writer_threads.split(",")]
    trees = {f"{layout}, {w} writer{'s' if w > 1 else ''}": (ROOT, {**LAYOUTS[layout], "writer_threads": w})
             for layout in args.layouts.split(",") for w in writers}
    if args.baseline:
        base = work / f"baseline-{args.baseline}"
        if not base.is_dir():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline], check=True,
                           capture_output=True)
        trees[f"baseline {args.baseline}"] = (base, json.loads(args.baseline_options))
    cpus: set[int] | None = None
    if args.store:
        all_cpus = sorted(os.sched_getaffinity(0))
        if len(all_cpus) < 2:
            raise SystemExit("--store needs 2 CPUs: one for the jobs, one for the S3 server")
        cpus, args.threads = {all_cpus[0]}, args.threads or 1
        server = start_store(set(all_cpus[1:]))
        trees["this tree, to s3"] = (ROOT, {"writer_threads": 1})
    best: dict[str, dict] = {}
    for rep in range(args.repeats):
        for name, (tree, extra) in trees.items():
            out = work / f"out-{name.replace(' ', '_').replace(',', '')}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            if name.endswith("to s3"):
                out = f"s3://bench/out-{rep}"  # type: ignore[assignment]
            result = run_job(tree, corpus, out, model, args.dtype, args.threads, extra, cpus, args.no_model)
            if not args.store:
                result["bytes"] = tree_bytes(out)
                shutil.rmtree(out, ignore_errors=True)  # ~40 kB per row: a run's output is not kept
            print(f"  {name:>20}, run {rep + 1}: {result['tokens_per_s']:>9,.0f} tokens/s", flush=True)
            if name not in best or result["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = result
    if args.store:
        server.kill()
    rate = disk_rate(work, max((r.get("bytes", 0) for r in best.values()), default=0))
    ours = next(iter(best.values()))
    base = best.get(f"baseline {args.baseline}")
    named = f"model {args.model}" if args.model else "tiny model (D = 1024, 3 layers)"
    named += ", its compute off the host (--no-model: a GPU's case)" if args.no_model else ""
    print(f"host side, {named}, {args.rows:,} sotu rows = {ours['tokens']:,} tokens, "
          f"mixed {args.dtype}, best of {args.repeats}, {len(os.sched_getaffinity(0))} CPUs"
          + (" (each job on one core, the S3 server on the others)" if cpus else "") + ":")
    print(f"  {'':>28} {'tokens/s':>9} {'per CPU s':>10}" + (" vs baseline" if base else ""))
    for name, r in best.items():
        per_cpu = r["tokens"] / r["stages"]["process_cpu_seconds"] if r.get("stages") else float("nan")
        ratio = f" {r['tokens_per_s'] / base['tokens_per_s']:>10.2f}x" if base else ""
        print(f"  {name:>28} {r['tokens_per_s']:>9,.0f} {per_cpu:>10,.0f}{ratio}")
    print("  (per CPU s: tokens per second of one core's time, all threads; a GPU host's writers reach about that "
          "many tokens/s per core they are given)")
    print(f"  the output's disk ({work}): {rate / 1e6:,.0f} MB/s written and fsynced; the ceiling it sets, per layout: "
          + ", ".join(f"{name} {rate * r['tokens'] / r['bytes']:,.0f} tokens/s ({r['bytes'] / r['tokens']:,.0f} B a token)"
                      for name, r in best.items() if r.get("bytes")))
    if args.store:
        r = best["this tree, to s3"]
        print(f"  to s3: {r['requests'] / r['shards']:.1f} store requests per shard ({r['requests']:,} for "
              f"{r['shards']} shards, the lock and the manifest included); the store costs "
              f"{1 - r['tokens_per_s'] / ours['tokens_per_s']:.0%} of the local disk's throughput (target <= 15 %)")
    for name, r in best.items():
        if r.get("stages"):
            st = r["stages"]
            print(f"  {name} stages (wall s, overlapping): " + ", ".join(f"{k} {v:.1f}" for k, v in st["seconds"].items())
                  + f"; process CPU {st['process_cpu_seconds']:.1f} s over {st['wall_seconds']:.1f} s; bound by "
                  + st.get("bound_by", "?") + f"; {r['shards']} shards"
                  + (f"; writers (s): {', '.join(f'{v:.1f}' for v in st['writers'].values())}" if st.get("writers") else ""))
            host = sum(v for k, v in st["seconds"].items() if k != "model")
            print(f"    without the model stage (its steps on this CPU; a GPU's device time and launches): "
                  f"read, prepare, assemble and write {host:.1f} thread-seconds = {r['tokens'] / host:,.0f} tokens/s "
                  f"a core" + _their_cpu(r))


def _their_cpu(r: dict) -> str:
    """The job's other work's CPU: the process's less the model stage's thread's, where the model ran
    on that one thread (with more, its direction threads' CPU is not told apart)."""
    st = r["stages"]
    if "cpu_seconds" not in st:
        return ""
    if r.get("threads") != 1:
        return f"; their CPU not told apart (the model on {r.get('threads')} threads)"
    other = st["process_cpu_seconds"] - st["cpu_seconds"]["model"]
    return f"; their CPU (the process's less the model stage's thread's: the model on one thread) {other:.1f} s = " \
           f"{r['tokens'] / other:,.0f} tokens/s a core"


if __name__ == "__main__":
    main()
