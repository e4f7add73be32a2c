"""A deliberately straightforward float64 ELMo, written from the published format alone.

It reads the hdf5 datasets as bilm-tf stores them (TF orientation, gate order i, j, f, o, forget
bias +1 at run time, highway gate on the transform) and loops over tokens and timesteps in numpy.
Tests compare the fast model against it; it shares no code with the project.
"""
from __future__ import annotations

import h5py
import numpy as np


def char_ids(token: str, max_chars: int = 50) -> list[int]:
    if token == "<S>":
        ids = [258, 256, 259] + [260] * (max_chars - 3)
    elif token == "</S>":
        ids = [258, 257, 259] + [260] * (max_chars - 3)
    else:
        b = token.encode("utf-8", "ignore")[: max_chars - 2]
        ids = [258] + list(b) + [259] + [260] * (max_chars - len(b) - 2)
    return [i + 1 for i in ids]


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


class ReferenceElmo:
    def __init__(self, options: dict, weights_path: str) -> None:
        with h5py.File(weights_path, "r") as f:
            self.w = {}
            f.visititems(lambda n, o: self.w.__setitem__(n, np.asarray(o[...], np.float64)) if isinstance(o, h5py.Dataset) else None)
        self.o = options
        self.embed = np.vstack([np.zeros((1, self.w["char_embed"].shape[1])), self.w["char_embed"]])

    def token(self, tok: str) -> np.ndarray:
        cc = self.o["char_cnn"]
        e = self.embed[char_ids(tok, cc["max_characters_per_token"])]  # (50, E)
        act = np.tanh if cc.get("activation", "relu") == "tanh" else (lambda v: np.maximum(v, 0))
        feats = []
        for i, (width, n) in enumerate(cc["filters"]):
            W, b = self.w[f"CNN/W_cnn_{i}"][0], self.w[f"CNN/b_cnn_{i}"]  # (w, E, n)
            conv = [sum(e[p + k] @ W[k] for k in range(width)) + b for p in range(e.shape[0] - width + 1)]
            feats.append(act(np.max(conv, axis=0)))
        x = np.concatenate(feats)
        for k in range(cc.get("n_highway", 0)):
            g = _sig(x @ self.w[f"CNN_high_{k}/W_carry"] + self.w[f"CNN_high_{k}/b_carry"])
            t = np.maximum(x @ self.w[f"CNN_high_{k}/W_transform"] + self.w[f"CNN_high_{k}/b_transform"], 0)
            x = g * t + (1 - g) * x
        return x @ self.w["CNN_proj/W_proj"] + self.w["CNN_proj/b_proj"]

    def _direction(self, xs: np.ndarray, d: int) -> list[np.ndarray]:
        ls = self.o["lstm"]
        cclip, pclip = ls.get("cell_clip") or 0, ls.get("proj_clip") or 0
        outs, inp = [], xs
        for layer in range(ls["n_layers"]):
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            W0, B, WP = self.w[f"{cell}/W_0"], self.w[f"{cell}/B"], self.w[f"{cell}/W_P_0"]
            C = ls["dim"]
            h, c = np.zeros(WP.shape[1]), np.zeros(C)
            out = []
            for x in inp:
                z = np.concatenate([x, h]) @ W0 + B
                i, j, f, o = z[:C], z[C:2 * C], z[2 * C:3 * C], z[3 * C:]
                c = _sig(f + 1.0) * c + _sig(i) * np.tanh(j)
                if cclip > 0:
                    c = np.clip(c, -cclip, cclip)
                h = (_sig(o) * np.tanh(c)) @ WP
                if pclip > 0:
                    h = np.clip(h, -pclip, pclip)
                out.append(h)
            out = np.array(out)
            if layer > 0 and ls.get("use_skip_connections", False):
                out = out + inp
            outs.append(out)
            inp = out
        return outs

    def layers(self, sentence: list[str]) -> np.ndarray:
        """(L+1, n, 2P) for one sentence, boundaries removed."""
        toks = ["<S>"] + list(sentence) + ["</S>"]
        x = np.array([self.token(t) for t in toks])
        fwd = self._direction(x, 0)
        bwd = [o[::-1] for o in self._direction(x[::-1], 1)]
        layers = [np.concatenate([x, x], -1)] + [np.concatenate([f, b], -1) for f, b in zip(fwd, bwd)]
        return np.array(layers)[:, 1:-1]
