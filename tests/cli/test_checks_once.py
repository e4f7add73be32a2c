"""One ``elmo embed``: each record is made once at the door and each of its checks runs once; what
is below the door reads the records (``inference.run_settings.RunSettings`` and the ``ModelRun`` it
resolves to, ``pipelines.options.EmbedOptions``, ``elmo_core.vectors.VectorRequest``). Counted by
a profiler over every thread of the job (calls, not timings: a count cannot flake)."""
from __future__ import annotations

import collections
import sys
import threading

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


def _counted(argv: list[str]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call":
            code = frame.f_code
            for (path, name), what in CHECKS.items():
                if code.co_name == name and code.co_filename.endswith(path):
                    counts[what] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        assert main(argv) == 0
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return counts


def test_one_embed_checks_each_setting_once(tiny_dir, tmp_path):
    from corpora.sample import write_sample_corpus

    write_sample_corpus(tmp_path / "corpus", rows=30, files=1)
    argv = ["embed", "--text", str(tmp_path / "corpus"), "--model", str(tiny_dir), "--threads", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "first")]) == 0  # the modules' own defaults made at import, not counted
    counts = _counted([*argv, "--out", str(tmp_path / "out")])
    assert counts == {what: 1 for what in CHECKS.values()}, counts
