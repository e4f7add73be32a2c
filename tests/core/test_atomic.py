"""The one atomic writer (``storage/atomic.py``): a file or a shared directory is whole or absent."""
from __future__ import annotations

import fnmatch
import os
import shutil
import signal
import subprocess

import pytest

from storage.atomic import TMP_GLOB, atomic_dir, host_tag, remove_stale_temporaries, temporary_name, \
    write_json_atomic, write_text_atomic, writer_host
from tests.helpers import killed_inside, writer_inside


def test_a_shared_directory_is_published_once_and_a_late_builder_keeps_the_first(tmp_path):
    target = tmp_path / "cache" / "entry"
    with atomic_dir(target, "done") as tmp:
        (tmp / "data").write_text("first")
        (tmp / "done").write_text("")
        assert not target.exists()  # nothing visible while it is built
    with atomic_dir(target, "done") as tmp:  # a second process's build, finished after the first
        (tmp / "data").write_text("second")
        (tmp / "done").write_text("")
    assert (target / "data").read_text() == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["entry"]  # no temporary left behind


def test_a_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "entry"
    with pytest.raises(RuntimeError):
        with atomic_dir(target, "done") as tmp:
            (tmp / "data").write_text("half")
            raise RuntimeError("the build failed")
    assert list(tmp_path.iterdir()) == []


def test_a_file_is_replaced_whole(tmp_path):
    write_json_atomic(tmp_path / "r.json", {"a": 1})
    write_json_atomic(tmp_path / "r.json", {"a": 2})
    assert (tmp_path / "r.json").read_text() == '{\n  "a": 2\n}\n' and len(list(tmp_path.iterdir())) == 1


def test_replace_swaps_a_directory_whole_and_a_failed_build_keeps_the_old_one(tmp_path):
    """``replace`` (the shipped default model's OUT): the new directory takes the old one's place;
    a build that fails leaves the old directory as it was."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "old-only").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(target, "card.json", replace=True) as tmp:
            (tmp / "card.json").write_text("{}")
            raise RuntimeError("the build failed")
    assert sorted(p.name for p in target.iterdir()) == ["old-only"]
    with atomic_dir(target, "card.json", replace=True) as tmp:
        (tmp / "card.json").write_text("{}")
        assert (target / "old-only").exists()  # the old one is served while the new one is built
    assert sorted(p.name for p in target.iterdir()) == ["card.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left aside


def test_a_path_a_file_stands_in_the_way_of_is_named_and_folders_above_are_made(tmp_path):
    from elmo_core.errors import InputError
    from storage.atomic import atomic_path

    (tmp_path / "afile").write_text("x")
    for target, says in ((tmp_path / "afile" / "sub" / "x.json", f"{tmp_path / 'afile'} is a file, not a directory"),
                         (tmp_path, "is a directory; give a file name")):
        with pytest.raises(InputError, match=says):
            write_json_atomic(target, {})
    with pytest.raises(InputError, match="is a file; give a directory"):
        with atomic_dir(tmp_path / "afile", "done"):
            pass
    with atomic_path(tmp_path / "new" / "deeper" / "x.txt") as tmp:  # its folders made, as atomic_dir makes them
        tmp.write_text("y")
    assert (tmp_path / "new" / "deeper" / "x.txt").read_text() == "y" and (tmp_path / "afile").read_text() == "x"


def _write(kind: str, target, text: str) -> None:  # type: ignore[no-untyped-def]
    """A write of ``target`` in this process, as ``tests.helpers.writer_inside``'s writer makes it."""
    if kind == "file":
        write_text_atomic(target, text)
        return
    with atomic_dir(target, "done") as tmp:
        (tmp / "done").write_text(text)


def _dead_pid() -> int:
    """A pid no process has: a process's that exited and was reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_writer_killed_inside_leaves_its_temporary_and_the_next_write_of_the_path_removes_it(tmp_path, spawn, kind):
    """A checkpoint, export or cache entry whose writer was SIGKILLed no longer stays on disk for good."""
    target = tmp_path / "ckpt-00000003.safetensors"
    left = killed_inside(spawn, kind, target)
    assert left.parent == tmp_path and left.name.startswith(f".{target.name}.{writer_host()}.")
    assert fnmatch.fnmatch(left.name, TMP_GLOB)  # cleaners of a whole directory still find it
    _write(kind, target, "ours")
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert (target if kind == "file" else target / "done").read_text() == "ours"


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_live_writers_temporary_is_kept_and_its_write_completes(tmp_path, spawn, kind):
    """Two processes writing one path (Ray workers, commands sharing a cache): neither removes the other's."""
    target = tmp_path / "entry"
    proc, theirs = writer_inside(spawn, kind, target)
    _write(kind, target, "ours")
    assert (theirs if kind == "file" else theirs / "done").read_text() == "theirs"
    proc.stdin.close()
    assert proc.wait() == 0
    # a file: the last rename wins; a shared directory: the first published is kept
    assert (target if kind == "file" else target / "done").read_text() == ("theirs" if kind == "file" else "ours")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_only_this_hosts_dead_writers_temporaries_of_the_path_are_removed(tmp_path):
    target, dead = tmp_path / "x.json", _dead_pid()
    removed = [temporary_name(target, pid=dead), temporary_name(target, "old", pid=dead),
               temporary_name(target, "probe", pid=dead)]
    kept = [temporary_name(target, host="elsewhere", pid=dead),  # another host's: its writer may be alive
            tmp_path / f".x.json.{dead}.tmp",  # an earlier version's, which names no host
            temporary_name(tmp_path / "x.json.5", pid=dead),  # another path's (x.json.5)
            temporary_name(tmp_path / f"x.json.{writer_host()}", pid=dead)]
    assert [p.name for p in removed[:2]] == [f".x.json.{writer_host()}.{dead}{tag}.tmp" for tag in ("", ".old")]
    for p in removed + kept:
        p.mkdir() if p.name.endswith(".old.tmp") else p.write_text("left")
    write_json_atomic(target, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name] + [p.name for p in kept])


def test_the_lock_holder_removes_every_writers_temporary_of_the_path_but_its_own(tmp_path):
    """``remove_stale_temporaries`` (``--format hdf5`` under its output's lock): no writer of the path
    is alive, whatever its host, so all go; this process's own and other paths' stay."""
    target = tmp_path / "vectors.hdf5"
    others = [temporary_name(target, host="elsewhere", pid=os.getpid()), temporary_name(target, pid=os.getppid()),
              tmp_path / ".vectors.hdf5.999999.tmp"]
    stays = [temporary_name(target), temporary_name(tmp_path / "vectors.hdf5.x", host="elsewhere", pid=7)]
    for p in others + stays:
        p.write_text("left")
    assert sorted(remove_stale_temporaries(target)) == sorted(others)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in stays)


def test_a_host_name_is_written_one_way_and_without_a_dot():
    names = ["node1.example.com", "node1-example-com", "node1_example.com", "nœud", ""]
    tags = [host_tag(n) for n in names]
    assert tags[0] == "node1_2eexample_2ecom" and tags[1] == "node1-example-com" and tags[3] == "n_c5_93ud"
    assert len(set(tags)) == len(tags) and not any("." in t or not t for t in tags)


def test_a_writer_in_another_pid_namespace_is_another_host(tmp_path, spawn):
    """A container that shares the host's name (``--network host``) has pids of its own: its
    temporaries are never judged by this namespace's processes, alive or dead."""
    prefix = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("no new pid namespace can be made here (needs root and unshare)")
    target = tmp_path / "model.onnx"
    proc, theirs = writer_inside(spawn, "file", target, prefix)
    host = theirs.name[len(".model.onnx."):].split(".")[0]
    assert host.startswith(f"{writer_host()}+") and host != writer_host()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    write_text_atomic(target, "ours")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([theirs.name, "model.onnx"])
