"""int8 on trained models: the shipped model, one `elmo train` makes in a few minutes, one fine-tuned
from the shipped model, and random full-size weights.

Each model goes through the user's command, `elmo embed --text CORPUS --out OUT --model M --backend onnx
--precision int8` (int8 planned on the job's first 256 rows and validated on them); its exit status
and the products the plan kept in fp32 are printed. Then the int8 export that command built and the
fp32 export of the same model run with torch fp32 on held-out text the plan never saw (held-out
speeches' sentences after the default sample's first 256), taking turns: the min token cosine against
torch fp32 over every layer and the mix, tokens/s, and int8 / ONNX fp32.

Corpora from the sotu package split by speech (``corpora.sotu_text``, every 10th speech held out):
the fresh model trains on the train split for --train-minutes with `elmo train`'s defaults; the
fine-tuned one starts from models/default (`--init-from`) on the train split's speeches since 1950
for --finetune-minutes; CORPUS is --rows sentences of those speeches as Parquet.

  python bench/bench_int8_models.py [--train-minutes 3] [--finetune-minutes 2] [--rows 400]
                                    [--models default,trained,finetuned,full-size] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bilm import full_size_model, min_cosine, time_ours  # noqa: E402
from corpora.sotu import sotu_sentences  # noqa: E402
from corpora.sotu_text import split_speeches, write_sotu_corpus  # noqa: E402
from export.cache import cached_onnx_export  # noqa: E402
from export.text_parity import SAMPLE_SENTENCES  # noqa: E402
from inference import TorchBackend  # noqa: E402
from inference.registry import open_backend  # noqa: E402
from pipelines.calibration import calibration_sample  # noqa: E402

ELMO = [sys.executable, "-m", "elmo_cli"]


def elmo(args: list[str], env: dict[str, str]) -> int:
    print("$ elmo " + " ".join(args), flush=True)
    return subprocess.run(ELMO + args, cwd=ROOT, env=env).returncode


def write_inputs(work: Path, rows: int) -> tuple[Path, Path]:
    """WORK/sotu/{train,valid} text shards, WORK/recent (the train split's speeches since 1950) and
    WORK/corpus.parquet (``rows`` of its sentences)."""
    write_sotu_corpus(work / "sotu")
    recent = work / "recent"
    recent.mkdir(exist_ok=True)
    for shard in sorted((work / "sotu" / "train").glob("*.txt")):
        if int(shard.name[:4]) >= 1950:
            (recent / shard.name).write_text(shard.read_text())
    lines = [line for shard in sorted(recent.glob("*.txt")) for line in shard.read_text().splitlines() if line]
    corpus = work / "corpus.parquet"
    pq.write_table(pa.table({"id": list(range(rows)), "text": lines[-rows:]}), corpus)
    return recent, corpus


def build_models(work: Path, recent: Path, names: list[str], a: argparse.Namespace, env: dict[str, str]) -> dict:
    models = {"default": ROOT / "models" / "default"}
    if "trained" in names and not (work / "trained" / "model" / "weights.hdf5").is_file():
        elmo(["train", "--text", str(work / "sotu" / "train"), "--out", str(work / "trained"),
              "--max-minutes", str(a.train_minutes), "--threads", str(a.threads)], env)
    if "finetuned" in names and not (work / "finetuned" / "model" / "weights.hdf5").is_file():
        elmo(["train", "--text", str(recent), "--out", str(work / "finetuned"), "--init-from", str(models["default"]),
              "--max-minutes", str(a.finetune_minutes), "--threads", str(a.threads)], env)
    models["trained"], models["finetuned"] = work / "trained" / "model", work / "finetuned" / "model"
    if "full-size" in names:
        models["full-size"] = full_size_model(work)
    return {n: models[n] for n in names}


def held_out(n: int, batch: int) -> list[list[list[str]]]:
    """Held-out sentences of 5-60 tokens after the default calibration sample, in batches."""
    _, valid = split_speeches()
    sents = [s for _, s in sotu_sentences(valid, min_tokens=2)][SAMPLE_SENTENCES:]
    sents = [s for s in sents if 5 <= len(s) <= 60][:n]
    return [sents[i:i + batch] for i in range(0, len(sents), batch)]


def measure(name: str, model: Path, corpus: Path, work: Path, a: argparse.Namespace, env: dict[str, str]) -> dict:
    shutil.rmtree(work / "out" / name, ignore_errors=True)
    rc = elmo(["embed", "--text", str(corpus), "--out", str(work / "out" / name), "--model", str(model), "--backend", "onnx",
               "--precision", "int8", "--threads", str(a.threads)], env)
    result: dict = {"model": name, "embed_exit": rc}
    if rc != 0:
        return result
    sample = calibration_sample(corpus)
    root = Path(env["ELMO_CACHE_DIR"])
    int8, built = cached_onnx_export(model, "int8", threads=a.threads, root=root, sample=sample)
    assert not built, "the embed command's export was not found in the cache"
    fp32, _ = cached_onnx_export(model, "fp32", threads=a.threads, root=root, sample=sample)
    result["plan"] = json.loads((int8 / "manifest.json").read_text())["int8"]["describe"]
    runners = {"torch fp32": TorchBackend.from_files(model, threads=a.threads),
               "onnx fp32": open_backend(fp32, "onnx", threads=a.threads),
               "onnx int8": open_backend(int8, "onnx", threads=a.threads)}
    batches = held_out(a.sentences, 32)
    best: dict[str, float] = {}
    outs: dict = {}
    for _ in range(a.turns):
        for key, backend in runners.items():
            tps, outs[key] = time_ours(backend, batches)
            best[key] = max(best.get(key, 0.0), tps)
    result.update({f"{k} tokens/s": round(v) for k, v in best.items()})
    result["int8 / onnx fp32"] = round(best["onnx int8"] / best["onnx fp32"], 2)
    result["int8 min token cosine (held out)"] = round(min_cosine(outs["torch fp32"], outs["onnx int8"], batches[1:]), 6)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="default,trained,finetuned,full-size")
    ap.add_argument("--train-minutes", type=float, default=3.0)
    ap.add_argument("--finetune-minutes", type=float, default=2.0)
    ap.add_argument("--rows", type=int, default=400, help="rows of the embed job's corpus")
    ap.add_argument("--sentences", type=int, default=256, help="held-out sentences measured")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "elmo-bench-int8")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    a.workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ELMO_CACHE_DIR": str(a.workdir / "cache")}
    t0 = time.perf_counter()
    recent, corpus = write_inputs(a.workdir, a.rows)
    models = build_models(a.workdir, recent, names, a, env)
    results = [measure(n, m, corpus, a.workdir, a, env) for n, m in models.items()]
    for r in results:
        print(json.dumps(r), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
