"""`elmo sotu-corpus`: each split's directory written whole, so a second split never leaves the
first one's speeches behind (held-out text in train)."""
from __future__ import annotations

import pytest

from corpora.sotu_text import split_speeches, write_sotu_corpus
from elmo_core.errors import InputError


def test_a_second_split_replaces_the_first_and_a_users_files_are_refused(tmp_path):
    out = tmp_path / "sotu"
    write_sotu_corpus(out, valid_every=10, max_speeches=30)
    counts = write_sotu_corpus(out, valid_every=5, max_speeches=30)
    train, valid = split_speeches(5)
    got = {split: sorted(p.stem for p in (out / split).iterdir()) for split in ("train", "valid")}
    assert got == {"train": sorted(train[:30]), "valid": sorted(valid[:30])}
    assert not set(got["train"]) & set(got["valid"])
    assert counts["valid"]["speeches"] == len(valid[:30])
    (out / "train" / "notes.md").write_text("mine")
    with pytest.raises(InputError, match="holds files that are not sotu speeches \\(notes.md\\)"):
        write_sotu_corpus(out)
    assert (out / "train" / "notes.md").read_text() == "mine"
    assert sorted(p.stem for p in (out / "valid").iterdir()) == sorted(valid[:30])  # nothing written
