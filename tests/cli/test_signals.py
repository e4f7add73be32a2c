"""The command's signal gate (elmo_cli/signals.py): a signal that arrives while a module imports is
raised once the import is done, never inside it. Deterministic: the module sends the signal to its own
process in its first line and checks, in its last, that it was not interrupted in between."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import os, signal, sys, time
from elmo_cli.signals import Terminated, command_signals

with open(os.path.join({here!r}, "slow_module.py"), "w") as f:
    f.write("import os, signal, time\\n"
            "os.kill(os.getpid(), signal.{name})\\n"
            "end = time.monotonic() + 0.3\\n"
            "while time.monotonic() < end: pass\\n"  # bytecodes run: an unheld signal is raised here
            "DONE = True\\n")
try:
    with command_signals():
        try:
            import slow_module
            time.sleep(10)
            print("never interrupted")
        except KeyboardInterrupt as e:
            print(type(e).__name__, sys.modules["slow_module"].DONE)
except KeyboardInterrupt:
    print("raised after the gate was closed")
"""


@pytest.mark.parametrize("name, raised", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_a_signal_during_an_import_is_raised_after_it(tmp_path, name, raised):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(here=str(tmp_path), name=name)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [raised, "True"], (r.stdout, r.stderr)


def test_a_signal_outside_imports_is_raised_at_once():
    code = textwrap.dedent("""
        import os, signal, time
        from elmo_cli.signals import command_signals
        with command_signals():
            start = time.monotonic()
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            except KeyboardInterrupt as e:
                print(type(e).__name__, time.monotonic() - start < 5)
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["Terminated", "True", "True"], (r.stdout, r.stderr)


def test_a_signal_during_a_finalizer_is_raised_after_it():
    """Raised inside a weak reference's callback (here ``weakref.finalize``'s; in the failures seen,
    ``WeakValueDictionary``'s), the interruption would be printed ("Exception ignored in") and lost:
    the command would run on to exit 0."""
    code = textwrap.dedent("""
        import os, signal, time, weakref
        from elmo_cli.signals import command_signals

        class Thing:
            pass

        def callback():
            os.kill(os.getpid(), signal.SIGINT)
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                pass
            print("callback done")

        with command_signals():
            try:
                thing = Thing()
                weakref.finalize(thing, callback)
                del thing
                time.sleep(10)
                print("never interrupted")
            except KeyboardInterrupt as e:
                print(type(e).__name__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.splitlines() == ["callback done", "KeyboardInterrupt"], (r.stdout, r.stderr)
    assert "Exception ignored" not in r.stderr


def test_a_command_run_from_an_import_is_not_held_for_that_import(tmp_path):
    """The import a command was called from (a user's module that runs it at import time) is not one
    to wait for: the signal is raised in the command, at once."""
    (tmp_path / "runs_a_command.py").write_text(textwrap.dedent("""
        import os, signal, time
        from elmo_cli.signals import command_signals

        with command_signals():
            start = time.monotonic()
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(10)
            except KeyboardInterrupt:
                print("raised", time.monotonic() - start < 5)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", "import runs_a_command"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.stdout.split() == ["raised", "True"], (r.stdout, r.stderr)
