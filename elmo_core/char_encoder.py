"""The char-CNN token encoder: char embedding, convolutions, max-pool, activation, highway, projection."""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import CharCnnConfig
from .highway import Highway, affine


# Rows a product of the char-CNN is run on at least (``CharEncoder._encode``).
MIN_ROWS = 4

Product = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class CharProducts:
    """The char-CNN's matrix products, the rest of its maths staying ``CharEncoder``'s:
    ``convs[k]`` multiplies width k's windows by its kernel, (M, E w) -> (M, n_k), no bias;
    ``highway[k]`` layer k's ``x W + b``, (N, F) -> (N, 2F); ``project`` the projection with its
    bias, (N, Dw+F) -> (N, P). ``CharEncoder.products()`` gives them in plain torch over the
    module's parameters; a fast variant passes its own (``inference.char_products``)."""

    convs: tuple[Product, ...]
    highway: tuple[Product, ...]
    project: Product


class CharEncoder(nn.Module):
    """Token representations from character ids.

    Row 0 of the char embedding is the all-zero padding row (ids are shifted by +1). With a word
    embedding (``words`` = (n_words, word_dim), dictionary models), each token's ids carry its
    word id (+1) after its C characters, and the projection's input is ``[word vector; char-CNN]``.

    Shape: (N, W) int ids, W = C (+1 with words) -> (N, P).
    """

    # Tokens are encoded at most this many per pass, shortest first, so each pass trims to its own
    # longest token (about a third less convolution work on sotu text). In inference it also bounds
    # memory: the widest convolution's output is ~100 KB a token at full size before the max-pool,
    # so one pass over the 2,000 distinct tokens of a batch held ~0.5 GB. Tokens are independent:
    # same values.
    chunk_tokens = 256

    def __init__(self, cfg: CharCnnConfig, projection_dim: int, boundary_ids: np.ndarray,
                 char_rows: int = 262, words: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.char_embed = nn.Parameter(torch.empty(char_rows, cfg.embedding_dim))  # (rows, E), row 0 = padding
        self.convs = nn.ModuleList(nn.Conv1d(cfg.embedding_dim, n, w) for w, n in cfg.filters)
        self.highway = Highway(cfg.n_filters, cfg.n_highway)
        word_dim = words[1] if words else 0
        self.word_embed = nn.Parameter(torch.empty(words[0] + 1, word_dim)) if words else None  # (n_words+1, Dw)
        self.proj_weight = nn.Parameter(torch.empty(word_dim + cfg.n_filters, projection_dim))  # (Dw+F, P) as TF stores it
        self.proj_bias = nn.Parameter(torch.zeros(projection_dim))  # (P,)
        # (2, W): the ids of <S> and </S> as the model's tokenizer writes them
        self.register_buffer("boundary_ids", torch.from_numpy(boundary_ids).long(), persistent=False)  # (2, W)

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) if self.cfg.activation == "relu" else torch.tanh(x)

    def conv_kernels(self) -> list[torch.Tensor]:
        """Each width's convolution as the matrix its unfolded windows are multiplied by.
        Shape: [(E w, n_k)], rows in each window's (E, w) order."""
        E = self.cfg.embedding_dim
        return [conv.weight.permute(1, 2, 0).reshape(E * w, n) for (w, n), conv in zip(self.cfg.filters, self.convs)]

    def products(self) -> CharProducts:
        """The matrix products in plain torch, over the parameters as they are now."""
        return CharProducts(tuple(functools.partial(torch.matmul, other=k) for k in self.conv_kernels()),
                            self.highway.products(), functools.partial(affine, self.proj_weight, self.proj_bias))

    def forward(self, char_ids: torch.Tensor, products: CharProducts | None = None) -> torch.Tensor:
        """``products``: the matrix products (default ``products()``)."""
        products = products or self.products()
        if self.word_embed is not None:
            words = F.embedding(char_ids[:, -1].long(), self.word_embed)  # (N, Dw)
            chars = self._char_features(char_ids[:, :-1], products)  # (N, F)
            return self._project(torch.cat([words, chars], dim=-1), products)  # (N, P)
        return self._project(self._char_features(char_ids, products), products)  # (N, P)

    def plan_chunks(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """On the host, what ``_char_features`` finds on the device: the tokens' order (shortest
        first) and each ``chunk_tokens`` chunk's trimmed width (``_trim_tail``), for ``forward_planned``.

        Shape: char_ids (N, W) host ids -> order (N,), widths (ceil(N / chunk_tokens),)."""
        ids = char_ids[:, :-1] if self.word_embed is not None else char_ids
        lengths = _content_lengths(ids)  # (N,)
        order = torch.argsort(lengths, stable=True)  # (N,)
        widest = max(w for w, _ in self.cfg.filters)
        peaks = [int(part.max()) for part in lengths[order].split(self.chunk_tokens)] if len(order) else []
        return order, [min(ids.shape[1], peak + widest) for peak in peaks]

    def forward_planned(self, char_ids: torch.Tensor, widths: list[int], products: CharProducts | None = None) -> torch.Tensor:
        """``forward`` of tokens in the order ``plan_chunks`` gave, with its widths: the same values
        without reading the ids on the host. Shape: (N, W) -> (N, P)."""
        products = products or self.products()
        ids = char_ids[:, :-1] if self.word_embed is not None else char_ids
        n = self.chunk_tokens
        feats = torch.cat([self._encode(ids[i * n : (i + 1) * n, :w], products) for i, w in enumerate(widths)])  # (N, F)
        if self.word_embed is not None:
            feats = torch.cat([F.embedding(char_ids[:, -1].long(), self.word_embed), feats], dim=-1)
        return self._project(feats, products)  # (N, P)

    def _char_features(self, char_ids: torch.Tensor, products: CharProducts) -> torch.Tensor:
        """The char-CNN and highway layers. Shape: (N, C) -> (N, F)."""
        if _tracing():
            return self._encode(char_ids, products)
        lengths = _content_lengths(char_ids)  # (N,)
        n = self.chunk_tokens
        if char_ids.shape[0] <= n:
            return self._encode(self._trim_tail(char_ids, lengths), products)
        order = torch.argsort(lengths, stable=True)  # (N,) shortest first
        encoded = torch.cat([self._encode(self._trim_tail(char_ids[part], lengths[part]), products)
                             for part in order.split(n)])  # (N, F) in that order
        return encoded[torch.argsort(order)]  # (N, F)

    def _project(self, feats: torch.Tensor, products: CharProducts) -> torch.Tensor:
        """The projection, on at least ``MIN_ROWS`` rows (``_at_least``). Shape: (N, Dw+F) -> (N, P)."""
        return _at_least(feats, products.project)

    def _encode(self, char_ids: torch.Tensor, products: CharProducts) -> torch.Tensor:
        """Shape: (N, C') ids, the tail already trimmed -> (N, F), on at least ``MIN_ROWS`` tokens."""
        def encode(ids: torch.Tensor) -> torch.Tensor:
            emb = F.embedding(ids.long(), self.char_embed, padding_idx=0)  # (N, C', E)
            return self.highway(torch.cat(self._pooled(emb, products.convs), dim=-1), products.highway)  # (N, F)
        return _at_least(char_ids, encode)

    def _pooled(self, emb: torch.Tensor, convs: tuple[Product, ...]) -> list[torch.Tensor]:
        """Each width's convolution, max-pooled over positions, then the activation.

        The convolution is one matrix product over the unfolded windows (im2col); with 16 input
        channels this ran several times faster than oneDNN's Conv1d, forward and backward. The
        bias is added after the max, which gives the same value.

        Shape: emb (N, C', E) -> [(N, n_k)].
        """
        N, L, E = emb.shape
        out = []
        for (w, n), conv, product in zip(self.cfg.filters, self.convs, convs):
            windows = emb.unfold(1, w, 1).reshape(N * (L - w + 1), E * w)  # (N (L-w+1), E*w), each (E, w)
            scores = product(windows).view(N, L - w + 1, n)  # (N, L-w+1, n)
            out.append(self._activation(_max_over_windows(scores) + conv.bias))  # (N, n)
        return out

    def _trim_tail(self, char_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Drop trailing columns that only repeat each token's last id, keeping ``max width`` of them.

        A window lying wholly in such a tail gives the same value wherever it lies, and one of each
        width is kept, so every max-pool sees the same set of values: exact, not an approximation.

        Shape: (N, C), lengths (N,) from ``_content_lengths`` -> (N, C'), C' = min(C, longest + widest filter).
        """
        N, C = char_ids.shape
        if N == 0:
            return char_ids
        keep = min(C, int(lengths.max()) + max(w for w, _ in self.cfg.filters))
        return char_ids[:, :keep] if keep < C else char_ids

    def boundary_embeddings(self) -> torch.Tensor:
        """Shape: (2, P): the representations of <S> and </S>."""
        return self.forward(self.boundary_ids)


def _max_over_windows(scores: torch.Tensor) -> torch.Tensor:
    """The max-pool over positions. With autograd, ``max``: the gradient goes to one maximal window,
    as TF's max_pool sends it. Without, ``amax``: the same values, no indices, 8-16x faster on a
    CPU (torch 2.13, Zen 5, (256, 12, 1,024): 3.7 ms vs 0.23 ms; 20 % of a full-size char-CNN's
    time). Shape: (N, L, n) -> (N, n)."""
    return scores.max(dim=1).values if scores.requires_grad else scores.amax(dim=1)


def _content_lengths(char_ids: torch.Tensor) -> torch.Tensor:
    """Each token's length before its tail (the trailing run of its last id).

    Shape: (N, C) -> (N,) long.
    """
    varies = char_ids != char_ids[:, -1:]  # (N, C): not in the token's tail
    return (varies * torch.arange(1, char_ids.shape[1] + 1, device=char_ids.device)).amax(dim=1)  # (N,)


def _at_least(x: torch.Tensor, rows_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``rows_of(x)`` with fewer than ``MIN_ROWS`` rows run with the first repeated up to it, so that
    a token's vector does not depend on how many others share its pass (a token cache's misses):
    MKL multiplies 1-3 rows in other kernels, which sum in another order (1 ulp on a Zen 5).
    Shape: (N, ...) -> (N, ...)."""
    n = x.shape[0]
    if n == 0 or n >= MIN_ROWS or _tracing():
        return rows_of(x)
    return rows_of(torch.cat([x, x[:1].expand(MIN_ROWS - n, *x.shape[1:])]))[:n]  # (MIN_ROWS, ...) -> (N, ...)


def _tracing() -> bool:
    """Whether a tracer or an ONNX export runs this: ``torch.onnx`` is asked only where it is
    imported (an export imports it), never imported here (~0.15 s of a job's first batch)."""
    onnx = sys.modules.get("torch.onnx")
    return torch.jit.is_tracing() or (onnx is not None and onnx.is_in_onnx_export())
