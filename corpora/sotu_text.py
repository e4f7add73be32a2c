"""The default corpus: the ``sotu`` package's public-domain State of the Union speeches, split by
speech into train and valid, one whitespace-tokenized sentence a line, one shard per speech."""
from __future__ import annotations

from pathlib import Path

from storage.atomic import atomic_dir
from elmo_core.bounds import check_count
from elmo_core.errors import InputError

from .sotu import sotu_fileids, sotu_speech, split_sentences


def split_speeches(valid_every: int = 10) -> tuple[list[str], list[str]]:
    """Speech ids for train and valid: every ``valid_every``-th speech (chronologically) is valid."""
    ids = sotu_fileids()
    check_count("valid_every", valid_every, 2, 2 * len(ids) - 1)  # both splits hold a speech
    valid = [s for i, s in enumerate(ids) if i % valid_every == valid_every // 2]
    return [s for s in ids if s not in set(valid)], valid


def write_sotu_corpus(out_dir: str | Path, valid_every: int = 10, max_speeches: int | None = None) -> dict:
    """Write OUT/train/<speech>.txt and OUT/valid/<speech>.txt; returns counts per split. Each split's
    directory is replaced whole (an earlier split's speeches would stay in train: held-out text
    trained on); one that holds files other than sotu speeches is an InputError, left as it is."""
    out_dir = Path(out_dir)
    speeches = {f"{sid}.txt" for sid in sotu_fileids()}
    for split in ("train", "valid"):
        d = out_dir / split
        if foreign := sorted(p.name for p in d.iterdir() if p.name not in speeches) if d.is_dir() else []:
            raise InputError(f"{d} holds files that are not sotu speeches ({', '.join(foreign[:3])}); it would be "
                             f"replaced whole: choose another --out")
    counts = {}
    for split, ids in zip(("train", "valid"), split_speeches(valid_every)):
        n_sent = n_tok = 0
        with atomic_dir(out_dir / split, f"{ids[0]}.txt", replace=True) as tmp:
            for sid in ids[:max_speeches]:
                sents = split_sentences(sotu_speech(sid))
                (tmp / f"{sid}.txt").write_text("".join(" ".join(s) + "\n" for s in sents), encoding="utf-8")
                n_sent, n_tok = n_sent + len(sents), n_tok + sum(map(len, sents))
        counts[split] = {"speeches": len(ids[:max_speeches]), "sentences": n_sent, "tokens": n_tok}
    return counts
