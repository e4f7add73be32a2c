"""The original's (bilm-tf) parameter initialisations."""
from __future__ import annotations

import math

import torch

from .bilm import BiLM


@torch.no_grad()
def init_bilm(model: BiLM, seed: int = 0) -> BiLM:
    """Initialise every parameter as bilm-tf does, deterministically from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    cfg, enc, lstm = model.config.char_cnn, model.encoder, model.lstm
    enc.char_embed.uniform_(-1.0, 1.0, generator=g)
    enc.char_embed[0].zero_()  # the padding row
    for conv, (w, _) in zip(enc.convs, cfg.filters):
        if cfg.activation == "relu":
            conv.weight.normal_(0.0, math.sqrt(1.0 / (w * cfg.embedding_dim)), generator=g)
        else:
            conv.weight.uniform_(-0.05, 0.05, generator=g)
        conv.bias.zero_()
    F = cfg.n_filters
    enc.highway.weight.normal_(0.0, math.sqrt(1.0 / F), generator=g)
    enc.highway.bias.zero_()
    enc.highway.bias[:, F:] = -2.0  # b_carry starts at -2: the layer starts close to identity
    enc.proj_weight.normal_(0.0, math.sqrt(1.0 / F), generator=g)
    enc.proj_bias.zero_()
    P, C = model.config.lstm.projection_dim, model.config.lstm.dim
    # TF's default glorot_uniform: W_0 is one (2P, 4C) kernel, W_P_0 a (C, P) one.
    for w, fan_in, fan_out in ((lstm.w_input, 2 * P, 4 * C), (lstm.w_state, 2 * P, 4 * C), (lstm.w_proj, C, P)):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w.uniform_(-bound, bound, generator=g)
    lstm.bias.zero_()
    return model
