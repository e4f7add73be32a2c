"""The one atomic writer (``storage/atomic.py``): a file or a shared directory is whole or absent."""
from __future__ import annotations

import pytest

from storage.atomic import atomic_dir, write_json_atomic


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
