#!/usr/bin/env python
"""Reference outputs from HIT-SCIR ELMoForManyLangs' OWN code, for testing our loader.

Run with the peer venv built by scripts/setup_elmoformanylangs.sh:

    /tmp/peer-efml/bin/python scripts/efml_reference.py OUT_DIR

For each small config below it
  1. writes a model directory laid out like a released ELMoForManyLangs model
     (config.json whose `config_path` names the inner config JSON, char.dic, word.dic),
  2. builds their training-side `biLM.Model` from it (the same EmbeddingLayer /
     ConvTokenEmbedder / ElmobiLm classes), overwrites every parameter with seeded
     random normals and saves it with their own `Model.save_model` (token_embedder.pkl,
     encoder.pkl = torch.save of the two sub-modules' state_dicts),
  3. loads it back with their public `Embedder(model_dir)` and runs
     `sents2elmo(SENTENCES, output_layer=-2)` (all 3 layers) and `output_layer=-1`
     (average), each on a FRESH Embedder with batch_size >= len(SENTENCES) so the
     stateful encoder starts from zero state (see `stateful_demo` in meta.json).

Output in OUT_DIR:
  <model>/                  model dirs: char_cnn (char CNN only, word_dim 0, relu),
                            word_char_cnn (word emb + char CNN, tanh), word_only (char_dim 0),
                            word_char_cnn_legacy (same weights as word_char_cnn, .pkl files in the
                            legacy non-zip torch format with 'cuda:0' storages, as released models)
  reference.hdf5            /<model>/<i>          float32 (3, n_tokens_i, 2*projection_dim)
                            /<model>/avg/<i>      float32 (n_tokens_i, 2*projection_dim)
                            /<model>/char_ids/<i> int64 (n_tokens_i + 2, max_chars)  [if chars]
                            /<model>/word_ids/<i> int64 (n_tokens_i + 2,)            [if words]
                            (ids exactly as their create_one_batch builds them, incl. <bos>/<eos> rows)
  sentences.json            the token lists (index i = dataset name)
  meta.json                 configs, clip-engagement counts, stateful-encoder demo
"""
import json
import os
import random
import sys

import h5py
import numpy as np
import torch

import elmoformanylangs
from elmoformanylangs import Embedder
from elmoformanylangs import biLM
from elmoformanylangs.elmo import read_list
from elmoformanylangs.frontend import create_one_batch
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

SEED = 1234
MAX_CHARS = 12  # must be >= 7: their create_one_batch asserts len('<bos>') + 2 <= max_chars

# Test sentences. Characters NOT in char.dic (-> <oov> char id): 'û', 'ß', 'ø', '語', '。', 'Z', '!'
SENTENCES = [
    ["The", "café", "served", "crème", "brûlée", "."],
    ["今天", "天氣", "真", "好", "。"],
    ["naïve"],  # one-token sentence
    ["supercalifragilisticexpialidocious", "is", "abcdefghij", "abcdefghijk", "long"],  # 34 chars (truncated), exactly max_chars-2, max_chars-1
    ["Straße", "ø", "中文", "語", "a\u3000b", "Zoë", "!"],  # U+3000 is in char.dic via the 1-field-line quirk
    ["the", "cat", "sat", "on", "the", "mat", "with", "the", "café", "owner"],
]

# Character inventory written to char.dic (plus the 6 specials and U+3000).
CHARS = (list("abcdefghijklmnopqrstuvwxyz") + list("TS.,")
         + list("éèêàçïëüöñ")           # accented (û, ø, ß deliberately absent)
         + list("今天氣真好中文字人")      # CJK (語 and 。 deliberately absent)
         + ["<", ">"])
CHAR_SPECIALS = ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]  # biLM.py:541 order
WORD_SPECIALS = ["<oov>", "<bos>", "<eos>", "<pad>"]                     # biLM.py:516 order
WORDS = ["the", "The", "café", "cat", "sat", "on", "mat", "今天", "天氣", "好", "中文", "is", "long", "."]

BASE_ENCODER = {"name": "elmo", "projection_dim": 16, "cell_clip": 3, "proj_clip": 3,
                "dim": 32, "n_layers": 2}
MODELS = {
    # char CNN only, like the default relu setup
    "char_cnn": {"token_embedder": {"name": "cnn", "activation": "relu",
                                    "filters": [[1, 4], [2, 8], [3, 16], [4, 8]],
                                    "n_highway": 2, "word_dim": 0, "char_dim": 50,
                                    "max_characters_per_token": MAX_CHARS}},
    # word embedding + char CNN (the released configs have word_dim 100 and char_dim 50)
    "word_char_cnn": {"token_embedder": {"name": "cnn", "activation": "tanh",
                                         "filters": [[1, 8], [2, 8], [3, 16]],
                                         "n_highway": 1, "word_dim": 8, "char_dim": 50,
                                         "max_characters_per_token": MAX_CHARS}},
    # word embedding only (char_dim 0): no char.dic needed, no CNN/highway weights
    "word_only": {"token_embedder": {"name": "cnn", "activation": "relu",
                                     "filters": [[1, 4]], "n_highway": 1, "word_dim": 8,
                                     "char_dim": 0, "max_characters_per_token": MAX_CHARS}},
}


def full_config(name):
    cfg = {"encoder": dict(BASE_ENCODER)}
    cfg.update(json.loads(json.dumps(MODELS[name])))
    cfg["classifier"] = {"name": "sampled_softmax", "n_samples": 16}
    cfg["dropout"] = 0.1  # read by ElmobiLm (recurrent dropout, training only)
    return cfg


def write_dic(path, entries, rng):
    """entries: dict token -> id. Lines 'token\\tid' (biLM.py:597-603), written in a shuffled
    order so that a loader must use the id column, not the line number."""
    items = list(entries.items())
    rng.shuffle(items)
    with open(path, "w", encoding="utf-8") as f:
        for tok, i in items:
            f.write("{0}\t{1}\n".format(tok, i))


def make_model_dir(out_dir, name, rng):
    cfg = full_config(name)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    inner_name = "cnn_{}_tiny.json".format(name)
    with open(os.path.join(d, inner_name), "w") as f:
        json.dump(cfg, f, indent=2)
    # config.json = vars(opt) of `biLM train` (biLM.py:605); only config_path is read by Embedder.
    opt = {"seed": SEED, "gpu": -1, "train_path": "train.txt", "valid_path": None, "test_path": None,
           "config_path": inner_name, "word_embedding": None, "optimizer": "adam", "lr": 0.001,
           "lr_decay": 0.8, "model": d, "batch_size": 32, "max_epoch": 10, "clip_grad": 5,
           "max_sent_len": 20, "min_count": 3, "max_vocab_size": 150000,
           "save_classify_layer": False, "valid_size": 0, "eval_steps": None}
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(opt, f)

    # Dictionaries built as in biLM.train: data chars/words first, then specials appended.
    char_lexicon = {}
    for ch in CHARS:
        char_lexicon.setdefault(ch, len(char_lexicon))
    char_lexicon["\u3000"] = len(char_lexicon)  # line '\u3000\t<id>' -> strip() -> 1 field quirk
    for sc in CHAR_SPECIALS:
        char_lexicon.setdefault(sc, len(char_lexicon))
    word_lexicon = {}
    for sw in WORD_SPECIALS:
        word_lexicon.setdefault(sw, len(word_lexicon))
    for w in WORDS:
        word_lexicon.setdefault(w, len(word_lexicon))
    tcfg = cfg["token_embedder"]
    if tcfg["char_dim"] > 0:
        write_dic(os.path.join(d, "char.dic"), char_lexicon, rng)
    write_dic(os.path.join(d, "word.dic"), word_lexicon, rng)  # biLM.train always writes it

    # Their training Model, their EmbeddingLayer, then random weights, then their save_model.
    char_emb = EmbeddingLayer(tcfg["char_dim"], char_lexicon, fix_emb=False) if tcfg["char_dim"] > 0 else None
    word_emb = EmbeddingLayer(tcfg["word_dim"], word_lexicon, fix_emb=False) if tcfg["word_dim"] > 0 else None
    model = biLM.Model(cfg, word_emb, char_emb, len(word_lexicon), use_cuda=False)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            std = 0.1
            if pname.startswith("encoder.") and ("input_linearity" in pname or "state_linearity" in pname):
                std = 0.25  # strong enough that cell_clip=3 is actually hit
            if pname.startswith("encoder.") and "state_projection" in pname:
                std = 0.8   # strong enough that proj_clip=3 is actually hit
            p.normal_(0.0, std)
    model.save_model(d, False)
    return d, cfg, char_lexicon, word_lexicon


def write_legacy_copy(src_dir, dst_dir):
    """Copy a model dir, re-saving the two .pkl files the way the RELEASED models are stored:
    legacy (pre-1.6, non-zip) torch pickle with storages tagged 'cuda:0' (their config.json says
    gpu 3; torch 0.4 era). torch.serialization.location_tag is patched only while saving."""
    import shutil
    shutil.copytree(src_dir, dst_dir, dirs_exist_ok=True)
    orig = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        for f in ("token_embedder.pkl", "encoder.pkl"):
            sd = torch.load(os.path.join(src_dir, f), map_location="cpu", weights_only=True)
            torch.save(sd, os.path.join(dst_dir, f), _use_new_zipfile_serialization=False)
    finally:
        torch.serialization.location_tag = orig
    with open(os.path.join(dst_dir, "config.json"), encoding="utf-8") as fh:
        opt = json.load(fh)
    opt["model"] = dst_dir
    with open(os.path.join(dst_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(opt, fh)


class ClampCounter:
    """Counts elements saturated by torch.clamp during a run (pass-through, results unchanged)."""

    def __init__(self):
        self.orig = torch.clamp
        self.hits = {}   # last dim (cell_size -> memory clip, projection_dim -> proj clip) -> count
        self.total = {}

    def __enter__(self):
        def clamp(x, lo, hi):
            y = self.orig(x, lo, hi)
            k = "last_dim_{}".format(x.shape[-1])
            self.hits[k] = self.hits.get(k, 0) + int((y != x).sum())
            self.total[k] = self.total.get(k, 0) + x.numel()
            return y
        torch.clamp = clamp
        return self

    def __exit__(self, *a):
        torch.clamp = self.orig


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: efml_reference.py OUT_DIR")
    out_dir = os.path.abspath(sys.argv[1])
    os.makedirs(out_dir, exist_ok=True)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)

    meta = {"elmoformanylangs_file": elmoformanylangs.__file__, "torch": torch.__version__,
            "seed": SEED, "models": {}}
    with h5py.File(os.path.join(out_dir, "reference.hdf5"), "w") as h5:
        for name in MODELS:
            d, cfg, char_lex, word_lex = make_model_dir(out_dir, name, rng)
            tcfg = cfg["token_embedder"]

            # all layers, fresh Embedder, one batch
            emb = Embedder(d, batch_size=64)
            with ClampCounter() as cc:
                all_layers = emb.sents2elmo(SENTENCES, output_layer=-2)
            # average of the 3 layers, fresh Embedder (encoder is stateful across calls)
            avg = Embedder(d, batch_size=64).sents2elmo(SENTENCES, output_layer=-1)

            g = h5.create_group(name)
            for i, (a, m) in enumerate(zip(all_layers, avg)):
                assert a.shape == (3, len(SENTENCES[i]), 2 * cfg["encoder"]["projection_dim"]), a.shape
                assert np.allclose(a.mean(0), m, atol=1e-6)
                g.create_dataset(str(i), data=a.astype(np.float32))
                g.create_dataset("avg/{}".format(i), data=m.astype(np.float32))

            # the exact ids their batching code feeds the model, per sentence
            test, _ = read_list(SENTENCES, MAX_CHARS)
            for i, sent in enumerate(test):
                bw, bc, lens, _ = create_one_batch([sent], emb.word_lexicon, emb.char_lexicon, emb.config)
                if bc is not None:
                    g.create_dataset("char_ids/{}".format(i), data=bc[0].numpy().astype(np.int64))
                if bw is not None:
                    g.create_dataset("word_ids/{}".format(i), data=bw[0].numpy().astype(np.int64))

            # Demo of their stateful encoder: a SECOND call on the same Embedder starts from the
            # final states of the first call, so outputs differ.
            e2 = Embedder(d, batch_size=64)
            first = e2.sents2elmo(SENTENCES, output_layer=-2)
            second = e2.sents2elmo(SENTENCES, output_layer=-2)
            # batch_size=2 -> 3 batches in random.shuffle order, each seeded with the previous state
            random.seed(SEED)
            small = Embedder(d, batch_size=2).sents2elmo(SENTENCES, output_layer=-2)
            meta["models"][name] = {
                "model_dir": d,
                "config": cfg,
                "n_chars_in_dic": len(char_lex) if tcfg["char_dim"] > 0 else 0,
                "n_words_in_dic": len(word_lex),
                "clamp_saturated_elements": cc.hits, "clamp_total_elements": cc.total,
                "stateful_demo": {
                    "fresh_vs_reference_maxabs": float(max(np.abs(x - y).max() for x, y in zip(first, all_layers))),
                    "second_call_same_embedder_maxabs_diff": float(max(np.abs(x - y).max() for x, y in zip(second, first))),
                    "batch_size_2_maxabs_diff": float(max(np.abs(x - y).max() for x, y in zip(small, first))),
                    "layer0_second_call_maxabs_diff": float(max(np.abs(x[0] - y[0]).max() for x, y in zip(second, first))),
                },
            }
            print("{}: ok, {} sentences, shapes {}; clamp hits {}/{}; stateful 2nd-call diff {:.3g}".format(
                name, len(all_layers), [a.shape for a in all_layers], cc.hits, cc.total,
                meta["models"][name]["stateful_demo"]["second_call_same_embedder_maxabs_diff"]))

        # Released-format copy of the word+char model (legacy pickle, CUDA-tagged storages);
        # their Embedder (map_location=lambda storage, loc: storage) must give identical outputs.
        src = os.path.join(out_dir, "word_char_cnn")
        dst = os.path.join(out_dir, "word_char_cnn_legacy")
        write_legacy_copy(src, dst)
        leg = Embedder(dst, batch_size=64).sents2elmo(SENTENCES, output_layer=-2)
        for i, a in enumerate(leg):
            assert np.array_equal(a, h5["word_char_cnn/{}".format(i)][()]), i
        meta["word_char_cnn_legacy"] = {"model_dir": dst, "same_outputs_as": "word_char_cnn"}
        print("word_char_cnn_legacy: ok, identical outputs from legacy/CUDA-tagged pickles")

    with open(os.path.join(out_dir, "sentences.json"), "w", encoding="utf-8") as f:
        json.dump(SENTENCES, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out_dir, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    print("wrote", out_dir)


if __name__ == "__main__":
    main()
