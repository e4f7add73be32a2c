from __future__ import annotations

import os

# Tests run tiny models, often beside other processes (Ray workers, DDP ranks): OpenMP spinning
# on 2 cores then costs far more than it gives. Benchmarks set their own thread counts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
from elmo_core.process_env import settle  # noqa: E402

settle()  # before torch loads, as every door of the library does (elmo_core/process_env.py)
import shutil  # noqa: E402
import tempfile  # noqa: E402

# What the suite measures or builds per CPU (layouts timed beside the other test worker, exports)
# goes to a cache of the session's own, not the user's, whose next job would read a layout timed
# under the suite's load. Set before the workers start, so they share it; removed at the end.
_SESSION_CACHE = None
if "ELMO_CACHE_DIR" not in os.environ:
    os.environ["ELMO_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="elmo-test-cache-")
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers import FIXTURE, TINY_OPTIONS, make_model_dir  # noqa: E402
from tests.processes import start_process, stop_process  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Code under test may set torch's thread count (backends take ``threads``); restore it after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def spawn():
    """``spawn(cmd, **popen_kw)`` starts a process (``tests.processes.start_process``) that ends with
    the test, passed or failed: at teardown whatever is left of its process group is stopped."""
    started: list = []

    def start(cmd, **kw):  # type: ignore[no-untyped-def]
        proc = start_process(cmd, **kw)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        stop_process(proc, grace=10)


@pytest.fixture
def fixture_dir() -> Path:
    if not (FIXTURE / "lm_weights.hdf5").is_file():
        pytest.skip(f"the shared TF reference fixture is absent ({FIXTURE}); CI has ../shared beside the clone")
    return FIXTURE


@pytest.fixture
def fixture_model(fixture_dir: Path, tmp_path: Path) -> Path:
    """The TF reference model as a model directory (options.json + weights.hdf5)."""
    model = tmp_path / "fixture_model"
    model.mkdir()
    shutil.copy(fixture_dir / "options.json", model / "options.json")
    shutil.copy(fixture_dir / "lm_weights.hdf5", model / "weights.hdf5")
    return model


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny", TINY_OPTIONS)


def pytest_unconfigure(config) -> None:
    if _SESSION_CACHE is not None and not hasattr(config, "workerinput"):  # the session's, not a worker's
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def pytest_report_header(config) -> str:
    """The CPU the tolerances ran on (they must hold on AVX2, AVX-512 and AVX-512 BF16 alike)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return f"cpu: {model}, {os.cpu_count()} cores; {' '.join(simd) or 'no SIMD flags read'}"
