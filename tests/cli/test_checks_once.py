"""One ``elmo embed``: each record is made once at the door and each of its checks runs once; what
is below the door reads the records (``inference.run_settings.RunSettings`` and the ``ModelRun`` it
resolves to, ``pipelines.options.EmbedOptions``, ``elmo_core.vectors.VectorRequest``). Counted by
a profiler over every thread of the job (calls, not timings: a count cannot flake)."""
from __future__ import annotations

import collections
import sys
import threading
from typing import Callable

from elmo_cli.main import main

# (file, function): a record's checks, and the functions that check a run's settings
CHECKS = {
    ("pipelines/options.py", "__post_init__"): "EmbedOptions' checks",
    ("elmo_core/vectors.py", "__post_init__"): "VectorRequest's checks",
    ("inference/run_settings.py", "__post_init__"): "RunSettings' checks",
    ("inference/model_run.py", "resolve_run"): "the run resolved",
    ("runtime/settings.py", "check_threads"): "the thread count checked",
    ("inference/registry.py", "check_device"): "the device checked",
    ("inference/registry.py", "check_precision_for"): "the precision checked for its backend",
    ("inference/precision.py", "check_precision"): "the torch precision checked",
    ("elmo_core/names.py", "resolve_output"): "the output mode's name checked",
}


def _counted(call: Callable[[], object], checks: dict[tuple[str, str], str] = CHECKS) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call":
            code = frame.f_code
            for (path, name), what in checks.items():
                if code.co_name == name and code.co_filename.endswith(path):
                    counts[what] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return counts


def _embed(argv: list[str]) -> Callable[[], None]:
    def call() -> None:
        assert main(argv) == 0
    return call


def test_one_embed_checks_each_setting_once(tiny_dir, tmp_path):
    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    argv = ["embed", "--text", str(tmp_path / "corpus"), "--model", str(tiny_dir), "--threads", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0  # the modules' own defaults made at import, not counted
    counts = _counted(_embed([*argv, "--out", str(tmp_path / "out")]))
    assert counts == {what: 1 for what in CHECKS.values()}, counts


def test_an_embedder_opened_checks_its_batching_once(tiny_dir):
    """``Embedder.open`` checks ``batch_size`` and ``policy`` before the model loads; the Embedder it
    makes does not check them again (a caller's ``Embedder(backend, ...)`` checks them itself)."""
    from inference import Embedder

    embedders: list = []
    checks = {("inference/embedder.py", "_check_batching"): "the batching checked"}
    counts = _counted(lambda: embedders.append(Embedder.open(tiny_dir, batch_size=4)), checks)
    assert counts == {"the batching checked": 1}, counts
    with embedders[0] as emb:
        assert emb.batch_size == 4 and emb.policy.max_tokens_per_batch >= 4096
        assert len(emb.embed_sentences([["a", "b"], ["c"]])) == 2
        assert _counted(lambda: Embedder(emb.backend, 2), checks) == {"the batching checked": 1}


def test_a_resumed_embed_reads_and_settles_its_shard_size_once(tiny_dir, tmp_path):
    """A local job resumed weighs the tokens left (``job._tokens_left``) by the shards its OUTPUT_DIR
    holds, cut at the size the job records: that record is read once and the size settled once."""
    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    argv = ["embed", "--text", str(tmp_path / "corpus"), "--model", str(tiny_dir), "--threads", "1", "--quiet",
            "--out", str(tmp_path / "out"), "--rows-per-shard", "10"]
    assert main(argv) == 0
    shards = sorted(p.name for p in (tmp_path / "out").glob("*.parquet") if not p.name.startswith("_"))
    (tmp_path / "out" / shards[-1]).unlink()  # one shard of three to redo
    checks = {("pipelines/shard_size.py", "_recorded"): "the recorded size read",
              ("pipelines/shard_size.py", "settle_rows_per_shard"): "the size settled"}
    counts = _counted(_embed([*argv[:-2], "--resume"]), checks)
    assert counts == {"the recorded size read": 1, "the size settled": 1}, counts
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet") if not p.name.startswith("_")) == shards


def test_elmo_demo_scans_its_corpus_once(tiny_dir, tmp_path, capsys):
    """The demo's embed weighs its run's layout by the corpus's tokens as ``elmo embed`` does: the job
    scans the corpus (its footers) once and makes the run from them, which the probe opens too; the
    demo scanned it first itself. Its --weights reach the run (they were refused by the embed)."""
    argv = ["demo", "--work-dir", str(tmp_path / "demo"), "--model", str(tiny_dir), "--rows", "100",
            "--weights", str(tiny_dir / "weights.hdf5"), "--query", "We must work together ."]
    counts = _counted(_embed(argv), {("pipelines/source.py", "scan_inputs"): "the corpus scanned"})
    assert counts == {"the corpus scanned": 1}, counts
    out = capsys.readouterr().out
    assert "nearest contexts of 'work'" in out and "to: We must work together ." in out
    assert len(list((tmp_path / "demo").glob("sentences-100-*/_SUCCESS"))) == 1
