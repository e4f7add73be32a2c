"""`elmo serve`'s flags refused before the model is loaded or a port bound, each naming its flag
(issue 54, B3, B5, C2, D5): an empty --api-key (``--api-key "$KEY"`` with KEY unset) would serve
with no key at all, an empty --host bind every interface; --replicas 0 and --max-batch-tokens past
the documented cap of 2**31 - 1 are refused too. The model named does not exist: each refusal comes
before it is read."""
from __future__ import annotations

import pytest

from tests.helpers import run_cli

NO_KEY = "to serve without authentication on purpose, leave --api-key out (and ELMO_API_KEY unset)"


@pytest.mark.parametrize("flags, named", [
    (["--api-key", ""], f"--api-key is empty (is the variable in --api-key \"$KEY\" unset?): give the key; {NO_KEY}"),
    (["--api-key", "   "], "--api-key is empty"),
    (["--api-key", " key"], "--api-key begins or ends with spaces"),
    (["--host", ""], "--host is empty (''): give the address to listen on, 127.0.0.1 for this machine only or "
                     "0.0.0.0 for every interface"),
    (["--replicas", "0"], "--replicas must be a positive integer (at most 2147483647), got 0"),
    (["--num-gpus-per-replica", "1e308"], "--num-gpus-per-replica must be a finite number in [0, 256] GPUs"),
    (["--max-batch-tokens", str(2**31)], "--max-batch-tokens must be a positive integer (at most 2147483647; "
                                         "left out: the run's: on a CPU 4096 to 16384 by the model's width, sized "
                                         "to the GPU's memory on CUDA), "
                                         "got 2147483648"),
    (["--max-batch-tokens", str(2**63)], "--max-batch-tokens must be a positive integer (at most 2147483647"),
    (["--max-connections", str(2**40)], "--max-connections must be an integer from 0 to 2147483647"),
])
def test_serve_refuses_each_bad_flag_before_loading_the_model(tmp_path, flags, named):
    r = run_cli("serve", "--model", tmp_path / "absent", "--port", "0", *flags)
    assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_empty_elmo_api_key_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_API_KEY", "")
    r = run_cli("serve", "--model", tmp_path / "absent", "--port", "0")
    assert r.returncode == 2 and NO_KEY in r.stderr, r.stderr


def test_a_model_path_that_is_a_symlink_loop_exits_2_naming_it(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    r = run_cli("serve", "--model", loop, "--port", "0")
    assert r.returncode == 2 and f"--model {loop} cannot be resolved: its symbolic links form a loop" in r.stderr
    assert "Traceback" not in r.stderr
