"""The biLM: char-CNN token encoder under a stacked bidirectional LSTM.

Stateless by default: a sentence's vectors do not depend on its batch neighbours, padding or
order. Passing a state (see ``StatefulBiLM``) carries each row's (h, c) across calls, which is
only there to reproduce the original TensorFlow code.

This is the reference model, the one training runs. Inference plugs in faster code for four of
its steps through one interface, ``FastPath`` (``BiLM.use_fast_path``), used only while autograd is
off; ``inference.fast_path.FastInference`` implements it (token cache, reduced-precision weight
copies, packed products, CUDA graphs) and is tested against this model.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from .char_encoder import CharEncoder
from .chars import ByteTokenizer
from .config import ElmoConfig
from .dictionaries import DictionaryTokenizer
from .errors import ConfigError, InputError
from .lstm import BiLstmStack, LstmState, Packing, TokenRows, dense


Tokenizer = ByteTokenizer | DictionaryTokenizer


class FastPath(Protocol):
    """Faster code for four steps of ``BiLM``, each computing what the reference step computes
    (within the products' precision), used only while autograd is off."""

    def embed(self, char_ids: torch.Tensor) -> tuple[torch.Tensor | TokenRows, torch.Tensor, torch.Tensor] | None:
        """The LSTM's input from what the host already found of the batch, as ``_mask``,
        ``embed_tokens`` and ``_with_boundaries`` give it: x (B, T+2, P) (or its ``TokenRows``),
        mask (B, T), lengths (B,);
        None where the fast path holds no plan of this batch (the reference's steps run)."""

    def encode(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Distinct tokens' representations, as ``BiLM.encoder``. Shape: (U, C) -> (U, P) fp32."""

    def run_layer(self, layer: int, xs: torch.Tensor, pack: Packing, h: torch.Tensor,
                  c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer of both directions, as ``BiLstmStack.run_layer``."""

    def combine(self, x: torch.Tensor | TokenRows, lengths: torch.Tensor, weights: torch.Tensor, positions: slice,
                keep: torch.Tensor) -> torch.Tensor:
        """The layers combined, as ``BiLstmStack.forward_combined``."""


@dataclass
class BiLMOutput:
    """Shape: layers (B, L+1, T, 2P) zero at padding, mask (B, T) bool.

    ``state`` is each row's final (h, c), returned when a start state was given (stateful use).
    """

    layers: torch.Tensor
    mask: torch.Tensor
    state: LstmState | None


def unique_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of an integer matrix and each row's index among them, as
    ``torch.unique(x, dim=0, return_inverse=True)`` gives (in another order), ~10x faster.

    Each row is hashed to int64 by a fixed random linear map (wrapping), the hashes are deduplicated
    in 1-D, and the result is checked against every row: a hash collision falls back to
    ``torch.unique(dim=0)``, so the result is always exact. A numpy array (a batch's host plan,
    ``inference.host_batch``) is done in numpy, whose calls cost a small host array less than
    torch's, with the same map: the same rows in the same order.

    Shape: x (N, C) -> (U, C), (N,).
    """
    N, C = x.shape
    if isinstance(x, np.ndarray):
        return _unique_rows_numpy(x)
    keys = (x.long() * _hash_coefficients(C, x.device)).sum(dim=1)  # (N,) mod 2^64
    ukeys, inverse = torch.unique(keys, return_inverse=True)  # (U,), (N,)
    first = torch.full_like(ukeys, N).scatter_reduce_(0, inverse, torch.arange(N, device=x.device), "amin")  # (U,)
    uniq = x[first]  # (U, C)
    if not torch.equal(uniq[inverse], x):  # a collision
        return torch.unique(x, dim=0, return_inverse=True)
    return uniq, inverse


def _unique_rows_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``unique_rows`` of a host array. Shape: x (N, C) -> (U, C), (N,) int64."""
    keys = x @ _hash_coefficients(x.shape[1], torch.device("cpu")).numpy()  # (N,) int64 mod 2^64
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)  # (U,), (N,)
    uniq = x[first]  # (U, C)
    if not np.array_equal(uniq[inverse], x):  # a collision
        uniq, inverse = np.unique(x, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


@functools.lru_cache(maxsize=16)
def _hash_coefficients(columns: int, device: torch.device) -> torch.Tensor:
    """``unique_rows``' fixed random map, made once per width and device (a copy to a GPU waits)."""
    coeffs = torch.randint(-(2**62), 2**62, (columns,), generator=torch.Generator().manual_seed(columns),
                           dtype=torch.long)
    return coeffs if device.type == "cpu" else coeffs.to(device)


class BiLM(nn.Module):
    """Shape: char ids (B, T, C) -> layers (B, L+1, T, 2P), mask (B, T)."""

    def __init__(self, config: ElmoConfig, tokenizer: Tokenizer | None = None) -> None:
        super().__init__()
        self.config = config
        if tokenizer is None:
            if config.dictionaries is not None:
                raise ConfigError("this model takes token ids from its dictionaries; load it with load_bilm(model dir) "
                                  "or pass its DictionaryTokenizer")
            tokenizer = ByteTokenizer(config.char_cnn.max_characters_per_token)
        if tokenizer.width != config.token_width:
            raise ConfigError(f"the tokenizer gives {tokenizer.width} ids a token, the model takes {config.token_width}")
        self.tokenizer = tokenizer  # sentences -> token ids: ``tokenizer.batch(sentences)`` (B, T, W)
        d = config.dictionaries
        self.encoder = CharEncoder(config.char_cnn, config.lstm.projection_dim, tokenizer.boundary_ids(),
                                   config.char_rows, (d.n_words, d.word_dim) if d is not None and d.words else None)
        self.lstm = BiLstmStack(config.lstm, dropout=config.training.dropout)
        self.fast_path: FastPath | None = None

    def use_fast_path(self, path: FastPath | None) -> "BiLM":
        """Run ``path``'s steps instead of the reference's while autograd is off (None: the reference)."""
        self.fast_path = path
        return self

    def fast_path_in_use(self) -> FastPath | None:
        """The plugged-in fast path while autograd is off, else None (the reference runs)."""
        return None if torch.is_grad_enabled() else self.fast_path

    def embed_tokens(self, char_ids: torch.Tensor, mask: torch.Tensor, dedup: bool = True) -> torch.Tensor:
        """Token representations, zero at padding; the char-CNN runs once per distinct token.

        Shape: char_ids (B, T, C), mask (B, T) -> (B, T, P).
        """
        B, T, C = char_ids.shape
        flat_mask = mask.reshape(-1)  # (B*T,)
        real = char_ids.reshape(-1, C)[flat_mask]  # (N, C)
        fast = self.fast_path_in_use()
        encode = fast.encode if fast is not None else self.encoder
        if dedup and real.shape[0] > 1:
            uniq, inverse = unique_rows(real)  # (U, C), (N,)
            emb = encode(uniq)[inverse]  # (N, P)
        else:
            emb = encode(real)  # (N, P)
        out = emb.new_zeros(B * T, emb.shape[-1])  # (B*T, P)
        out[flat_mask] = emb
        return out.view(B, T, -1)

    def _with_boundaries(self, tokens: torch.Tensor, lengths: torch.Tensor,
                         fast: FastPath | None = None) -> torch.Tensor:
        """Put <S> first and </S> after each row's last token: encoded by ``fast`` where given (as the
        batch's tokens are, through its token cache: not again each batch), else by the encoder.

        Shape: tokens (B, T, P), lengths (B,) -> (B, T+2, P).
        """
        B, T, P = tokens.shape
        encoder = self.encoder
        # (P,), (P,)
        bos, eos = fast.encode(encoder.boundary_ids) if fast is not None else encoder.boundary_embeddings()
        pos = torch.arange(T + 2, device=tokens.device)  # (T+2,)
        is_eos = (pos[None, :] == (lengths + 1)[:, None]).to(tokens.dtype)  # (B, T+2)
        x = torch.cat([bos.expand(B, 1, P), tokens, tokens.new_zeros(B, 1, P)], dim=1)  # (B, T+2, P)
        return x + is_eos[:, :, None] * eos

    def _tokens(self, char_ids: torch.Tensor, fast: FastPath | None,
                dedup: bool = True) -> tuple[torch.Tensor | TokenRows, torch.Tensor, torch.Tensor]:
        """The tokens with their boundaries (the fast path's ``embed`` where it holds the batch's plan:
        it may give their ``TokenRows``). Shape: char_ids (B, T, C) -> x (B, T+2, P), mask (B, T), lengths (B,)."""
        got = fast.embed(char_ids) if fast is not None else None
        if got is not None:
            return got
        mask, lengths = self._mask(char_ids)
        return self._with_boundaries(self.embed_tokens(char_ids, mask, dedup), lengths, fast), mask, lengths

    @staticmethod
    def _mask(char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape: (B, T, C) -> mask (B, T) bool, lengths (B,); rows must be left-aligned. A numpy
        array (a host plan) gives numpy arrays."""
        mask = (char_ids > 0).any(-1)  # (B, T)
        lengths = mask.sum(1)  # (B,)
        T = char_ids.shape[1]
        if isinstance(char_ids, np.ndarray):
            aligned = np.array_equal(mask, np.arange(T)[None, :] < lengths[:, None])
        else:
            aligned = torch.equal(mask, torch.arange(T, device=mask.device)[None, :] < lengths[:, None])
        if not aligned:
            raise InputError("character ids must be left-aligned: padding tokens only after a row's last token")
        return mask, lengths

    def run_combined(self, char_ids: torch.Tensor, weights: torch.Tensor,
                     take: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The stateless biLM's layers combined as ``sum_j weights[j] * layer_j`` without building
        them: a scalar mix with its weights normalised (``gamma * softmax(s)``), the top layer
        (one-hot) or their average (1 / (L+1) each). See ``BiLstmStack.forward_combined``.
        ``take`` (n,) long, flat positions b*T+t: only those tokens, in that order.

        Shape: char_ids (B, T, C), weights (L+1,) -> (B, T, 2P) zero at padding (or (n, 2P)), mask (B, T).
        """
        T = char_ids.shape[1]
        fast = self.fast_path_in_use()
        x, mask, lengths = self._tokens(char_ids, fast)  # (B, T+2, P)
        run = fast.combine if fast is not None else self.lstm.forward_combined
        combined = run(x, lengths + 2, weights.to(x.dtype), slice(1, T + 1), mask, take=take)  # (B, T, 2P) or (n, 2P)
        return combined, mask

    def run(self, char_ids: torch.Tensor, state: LstmState | None = None,
            keep_boundaries: bool = False, dedup: bool = True) -> BiLMOutput:
        """The biLM on a batch of left-aligned sentences (boundary tokens are added here)."""
        T = char_ids.shape[1]
        fast = self.fast_path_in_use()
        x, mask, lengths = self._tokens(char_ids, fast, dedup)
        x = dense(x)  # (B, T+2, P)
        full_mask = torch.arange(T + 2, device=x.device)[None, :] < (lengths + 2)[:, None]  # (B, T+2)
        shortcut = state is None and not keep_boundaries  # the boundary outputs are dropped anyway
        lstm_layers, new_state = self.lstm(x, lengths + 2, state, boundary_shortcut=shortcut,
                                           run_layer=fast.run_layer if fast is not None else None)  # L x (B, T+2, 2P)
        kept, positions = (full_mask, slice(None)) if keep_boundaries else (mask, slice(1, T + 1))
        layers = _stacked_layers(x[:, positions], [h[:, positions] for h in lstm_layers], kept)  # (B, L+1, T', 2P)
        return BiLMOutput(layers, kept, new_state)

    def forward(self, char_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.run(char_ids)
        return out.layers, out.mask


def _stacked_layers(x: torch.Tensor, lstm_layers: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Layer 0 (each token twice) and the LSTM's layers in one tensor, zero where ``mask`` is False:
    one stack and one multiply in place (layer 0 also its one concatenation).
    Shape: x (B, T, P), L x (B, T, 2P), mask (B, T) -> (B, L+1, T, 2P)."""
    layers = torch.stack([torch.cat([x, x], dim=-1), *lstm_layers], dim=1)  # (B, L+1, T, 2P)
    return layers.mul_(mask[:, None, :, None].to(x.dtype))


class StatefulBiLM:
    """Carries each batch row's (h, c) into the next call, as the original TensorFlow code does.

    Row k of a call continues row k of the previous call; rows beyond the stored state start at
    zero. Only for reproducing the original: vectors then depend on what ran before.
    """

    def __init__(self, bilm: BiLM) -> None:
        self.bilm = bilm
        self.state: LstmState | None = None

    def reset(self) -> None:
        self.state = None

    def run(self, char_ids: torch.Tensor, keep_boundaries: bool = False) -> BiLMOutput:
        B = char_ids.shape[0]
        start = self.bilm.lstm.zero_state(B)
        if self.state is not None:
            k = min(B, self.state.h.shape[2])
            start.h[:, :, :k], start.c[:, :, :k] = self.state.h[:, :, :k], self.state.c[:, :, :k]
        out = self.bilm.run(char_ids, state=start, keep_boundaries=keep_boundaries)
        new = out.state.detach()
        if self.state is not None and self.state.h.shape[2] > B:  # keep rows this call did not use
            new = LstmState(torch.cat([new.h, self.state.h[:, :, B:]], 2), torch.cat([new.c, self.state.c[:, :, B:]], 2))
        self.state = new
        return out
