"""The char-CNN's matrix products on packed oneDNN weights (``elmo_core.char_encoder.CharProducts``).

For fp32 inference on a CPU whose LSTM products run on packed weights
(``FastLstm.per_direction_products``): MKL runs its AVX2 kernels on AMD CPUs with AVX-512, so
there the encoder's plain products ran at half of oneDNN's rate with weights packed once (Zen 5,
one core: the highway's 256 x 2048 @ 2048 x 4096 91 vs 215 GFLOP/s, the widest convolution's
3,072 x 112 @ 112 x 1,024 81 vs 159). Same arithmetic (fp32 accumulate); no autograd. Tested
against the encoder's own products in tests/inference/test_fast_path.py.
"""
from __future__ import annotations

import functools

import torch

from elmo_core.char_encoder import CharEncoder, CharProducts

from .packed_gemm import PackedLinear, weights_key


class PackedCharProducts:
    """``encoder``'s products, packed on first use and again whenever its parameters change."""

    def __init__(self, encoder: CharEncoder) -> None:
        self.encoder = encoder
        self._packed: tuple = (None, None)  # (the parameters' key, CharProducts)

    def __call__(self) -> CharProducts:
        e = self.encoder
        key = weights_key(e.parameters())
        if self._packed[0] != key:
            linear = lambda w, b=None: functools.partial(PackedLinear(w.detach()), bias=b)  # noqa: E731
            products = CharProducts(tuple(linear(k) for k in e.conv_kernels()),
                                    tuple(linear(w, b.detach()) for w, b in zip(e.highway.weight, e.highway.bias)),
                                    linear(e.proj_weight, e.proj_bias.detach()))
            self._packed = (key, products)
        return self._packed[1]
