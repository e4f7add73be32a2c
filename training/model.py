"""The bidirectional language model trained as the original: forward and backward LMs sharing the
char-CNN token encoder and one softmax; loss = mean of the two directions' mean NLL.

For training, both directions read their own (already ordered) input streams left to right, so
``run_directions`` runs ``BiLstmStack.run_packed`` on separate forward and backward inputs,
every row at full length (padding only ever trails a row and is masked in the loss).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from elmo_core import BiLM, ElmoConfig, LstmState
from elmo_core.init import init_bilm
from elmo_core.lstm import BiLstmStack, Packing, RunLayer

from .objective import Candidates, LogUniformSampler, full_softmax_nll, sampled_softmax_nll
from .segments import Segments, StepPlan
from .sparse_softmax import SoftmaxRows


def run_directions(lstm: BiLstmStack, xs: torch.Tensor, state: LstmState,
                   run_layer: RunLayer | None = None) -> tuple[torch.Tensor, LstmState]:
    """Both directions over their own inputs, each read left to right from ``state``: every row
    runs every step, so the inputs are already packed time-major (BiLstmStack.run_packed).

    Shape: xs (2, T, B, P) (direction 0 forward, 1 backward), state h (L, 2, B, P), c (L, 2, B, C)
    -> top layer (2, T, B, P), final state. ``run_layer``: see ``BiLstmStack.run_packed``.
    """
    D, T, B, P = xs.shape
    outputs, final = lstm.run_packed(xs.reshape(D, T * B, P), Packing.full(B, T, xs.device), state, run_layer)  # L x (2, T*B, P)
    return outputs[-1].view(D, T, B, P), final


def run_segments(lstm: BiLstmStack, x: torch.Tensor, seg: Segments, state: LstmState,
                 run_layer: RunLayer | None = None) -> tuple[torch.Tensor, LstmState]:
    """Both directions over sentence segments (training.segments), packed, each from its own
    initial state. Shape: x (2, B*T, P) rows' inputs in reading order -> top (2, B*T, P), final state."""
    xs = x.index_select(1, seg.source)  # (2, N, P)
    outputs, seg_final = lstm.run_packed(xs, seg.packing, seg.initial(state), run_layer)  # L x (2, N, P)
    padded = torch.cat([outputs[-1], outputs[-1].new_zeros(2, 1, outputs[-1].shape[-1])], dim=1)  # (2, N+1, P)
    return padded.index_select(1, seg.unpack), seg.final(state, seg_final)  # (2, B*T, P)


class LanguageModel(nn.Module):
    """biLM + one softmax over ``n_vocab`` words.

    Shape: chars (2, B, T, C), targets (2, B, T), mask (B, T) -> loss (), nll sums (2,).
    """

    def __init__(self, config: ElmoConfig, n_vocab: int) -> None:
        super().__init__()
        P = config.lstm.projection_dim
        self.bilm = BiLM(config)
        self.softmax_w = nn.Parameter(torch.empty(n_vocab, P))  # (V, P)
        self.softmax_b = nn.Parameter(torch.zeros(n_vocab))  # (V,)

    @property
    def config(self) -> ElmoConfig:
        return self.bilm.config

    def initialise(self, seed: int) -> "LanguageModel":
        """The original's initialisations; softmax W ~ N(0, 1/P), b = 0."""
        init_bilm(self.bilm, seed)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            self.softmax_w.normal_(0.0, 1.0 / math.sqrt(self.softmax_w.shape[1]), generator=g)
            self.softmax_b.zero_()
        return self

    def zero_state(self, batch: int) -> LstmState:
        return self.bilm.lstm.zero_state(batch)

    def top_layer(self, chars: torch.Tensor, mask: torch.Tensor, state: LstmState | None,
                  starts: torch.Tensor | None = None, plan: StepPlan | None = None) -> tuple[torch.Tensor, LstmState]:
        """``starts`` (B, T) bool: the state resets to zero there (a sentence's first input;
        training.segments); None: the state runs on through every row. ``plan``: the batch's data
        read beforehand on the host (training.segments), its segments for ``starts``.

        Shape: chars (2, B, T, C), mask (B, T) -> top (2, B, T, P), final state."""
        D, B, T, C = chars.shape
        both_mask = mask[None].expand(D, B, T).reshape(D * B, T)  # (2B, T)
        if plan is None:
            x = self.bilm.embed_tokens(chars.reshape(D * B, T, C), both_mask)  # (2B, T, P)
        else:
            x = plan.tokens.embed(self.bilm.encoder, (D * B, T, self.config.lstm.projection_dim))  # (2B, T, P)
        segments = plan.segments if plan is not None else None
        state = state if state is not None else self.zero_state(B)
        fast = self.bilm.fast_path_in_use()  # evaluation: the inference recurrence (training.perplexity)
        run_layer = fast.run_layer if fast is not None else None
        if starts is None and segments is None:
            top, final = run_directions(self.bilm.lstm, x.view(D, B, T, -1).transpose(1, 2), state, run_layer)  # (2, T, B, P)
            top = top.transpose(1, 2)  # (2, B, T, P)
        else:
            top, final = run_segments(self.bilm.lstm, x.view(D, B * T, -1),
                                      segments or Segments.of(starts, mask), state, run_layer)
            top = top.view(D, B, T, -1)  # (2, B, T, P)
        if self.training and self.bilm.lstm.dropout > 0:
            top = F.dropout(top, self.bilm.lstm.dropout, training=True)
        return top, final

    def forward(self, chars: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                state: LstmState | None = None, candidates: tuple[Candidates, Candidates] | None = None,
                sampler: LogUniformSampler | None = None, normaliser: float | None = None,
                rows: SoftmaxRows | None = None, plan: StepPlan | None = None) -> tuple[torch.Tensor, torch.Tensor, LstmState]:
        """Mean of the two directions' mean NLL (sampled softmax when ``candidates`` are given).
        ``rows``: the softmax rows the step reads, gathered as leaves for sparse updates
        (training.sparse_softmax); the loss then reads them instead of the whole softmax.
        ``normaliser``: the token count each direction's NLL sum is divided by (default: this
        batch's; data-parallel ranks pass all ranks' tokens / ranks). ``plan``: the batch's data
        read beforehand on the host (training.segments): the step then reads nothing on the device.

        Shape: -> loss (), per-direction NLL sums (2,) detached, final state.
        """
        top, final = self.top_layer(chars, mask, state, plan=plan)  # (2, B, T, P)
        losses, sums = [], []
        for d in range(2):
            if plan is None:
                h, y = top[d][mask], targets[d][mask]  # (N, P), (N,)
            else:
                h, y = top[d].reshape(-1, top.shape[-1]).index_select(0, plan.picked), targets[d].reshape(-1)[plan.picked]
            if candidates is not None:
                w, b, ids = (self.softmax_w, self.softmax_b, None) if rows is None else (rows.w, rows.b, rows.ids)
                nll = sampled_softmax_nll(h, y, w, b, candidates[d], sampler, ids)
            else:
                nll = full_softmax_nll(h, y, self.softmax_w, self.softmax_b)
            losses.append(nll.sum() / (normaliser if normaliser is not None else max(nll.numel(), 1)))
            sums.append(nll.detach().sum())
        return 0.5 * (losses[0] + losses[1]), torch.stack(sums), final
