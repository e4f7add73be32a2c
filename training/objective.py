"""The softmax objectives: TF-style sampled softmax (log-uniform candidates) and the full softmax.

``LogUniformSampler`` reproduces TensorFlow's ``log_uniform_candidate_sampler(unique=True)``:
P(k) = log((k + 2) / (k + 1)) / log(V + 1) (id k = k-th most frequent word); draws repeat until
``n`` distinct candidates are found, and each id's expected count is ``-expm1(tries * log1p(-P))``.
``sampled_softmax_nll`` then subtracts log(expected count) from every logit and removes accidental
hits (a sampled candidate equal to a row's label), as ``tf.nn.sampled_softmax_loss`` does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Candidates:
    """Shape: ids (S,) int64 distinct; tries: how many draws it took to find them."""

    ids: torch.Tensor
    tries: int


class LogUniformSampler:
    """Distinct candidate ids from the log-uniform (Zipfian) distribution over ``range_max`` ids."""

    def __init__(self, range_max: int, seed: int = 0) -> None:
        self.range_max = range_max
        self.log_range = math.log(range_max + 1)
        self.generator = torch.Generator().manual_seed(seed)

    def probability(self, ids: torch.Tensor) -> torch.Tensor:
        """Shape: (N,) int64 -> (N,) float64."""
        k = ids.double()
        return torch.log((k + 2.0) / (k + 1.0)) / self.log_range

    def expected_count(self, ids: torch.Tensor, n: int, tries: int) -> torch.Tensor:
        """Shape: (N,) -> (N,) float32, TF's ExpectedCountHelper."""
        p = self.probability(ids)
        if tries == n:
            return (p * n).float()
        return (-torch.expm1(tries * torch.log1p(-p))).float()

    def sample(self, n: int) -> Candidates:
        """``n`` distinct ids (n < range_max) in draw order, and the number of draws."""
        if not 0 < n < self.range_max:
            raise ValueError(f"can sample 1..{self.range_max - 1} distinct ids, not {n}")
        seen = torch.zeros(self.range_max, dtype=torch.bool)
        picked: list[torch.Tensor] = []
        have, tries = 0, 0
        while have < n:
            k = max(2 * (n - have), 64)
            u = torch.rand(k, generator=self.generator, dtype=torch.float64)  # (k,)
            draw = (torch.exp(u * self.log_range).long() - 1).clamp_(0, self.range_max - 1)  # (k,)
            uniq, inverse = torch.unique(draw, return_inverse=True)
            first = torch.full((uniq.numel(),), k, dtype=torch.long).scatter_reduce(
                0, inverse, torch.arange(k), reduce="amin", include_self=True)  # (U,)
            is_new = torch.zeros(k, dtype=torch.bool)
            is_new[first] = True
            is_new &= ~seen[draw]  # (k,)
            count = torch.cumsum(is_new.long(), 0)  # (k,)
            stop = int(torch.searchsorted(count, n - have)) if int(count[-1]) >= n - have else k - 1
            new = draw[: stop + 1][is_new[: stop + 1]]
            seen[new] = True
            picked.append(new)
            have, tries = have + new.numel(), tries + stop + 1
        return Candidates(torch.cat(picked), tries)

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def sampled_softmax_nll(h: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        cand: Candidates, sampler: LogUniformSampler,
                        row_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token sampled-softmax negative log-likelihood.

    ``row_ids``: the sorted vocabulary ids whose rows ``weight`` and ``bias`` hold (sparse updates
    gather only the rows a step reads; see training.sparse_softmax); None: all V rows.

    Shape: h (N, P), targets (N,), weight (V or R, P), bias (V or R,) -> (N,).
    """
    n = cand.ids.numel()
    ids = cand.ids.to(h.device)
    true_logq = torch.log(sampler.expected_count(targets, n, cand.tries))  # (N,)
    samp_logq = torch.log(sampler.expected_count(ids, n, cand.tries))  # (S,)
    if row_ids is not None:  # vocabulary ids -> rows of the gathered weight and bias
        targets, ids = torch.searchsorted(row_ids, targets), torch.searchsorted(row_ids, ids)
    true_logits = (h * F.embedding(targets, weight)).sum(-1) + bias[targets] - true_logq  # (N,)
    # The log-q correction is folded into the bias: one (N, S) pass fewer.
    samp_logits = _at_least_fp32(torch.addmm(bias[ids] - samp_logq, h, F.embedding(ids, weight).t()))  # (N, S)
    samp_logits = _remove_accidental_hits(samp_logits, targets, ids, weight.shape[0])
    # logsumexp over [true, sampled] without building the (N, 1+S) matrix
    return torch.logaddexp(_at_least_fp32(true_logits), torch.logsumexp(samp_logits, dim=1)) - true_logits


def _remove_accidental_hits(samp_logits: torch.Tensor, targets: torch.Tensor, ids: torch.Tensor,
                            n_vocab: int) -> torch.Tensor:
    """Where a row's label was also sampled, that candidate's logit gets -FLOAT_MAX, as TF's
    ``compute_accidental_hits`` does (O(N) lookups instead of an (N, S) comparison, and no host
    read of where the hits are).

    Shape: samp_logits (N, S), targets (N,), ids (S,) distinct.
    """
    position = torch.full((n_vocab,), -1, dtype=torch.long, device=ids.device)  # (V,) id -> candidate column
    position[ids] = torch.arange(ids.numel(), device=ids.device)
    col = position[targets][:, None]  # (N, 1)
    hit = col >= 0  # (N, 1): no host read of where the hits are
    col = col.clamp(min=0)
    kept = samp_logits.gather(1, col)  # (N, 1)
    return samp_logits.scatter(1, col, kept.masked_fill(hit, torch.finfo(samp_logits.dtype).min))


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def full_softmax_nll(h: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     chunk: int = 4096) -> torch.Tensor:
    """Per-token negative log-likelihood under the full softmax, ``chunk`` tokens at a time.

    Shape: h (N, P), targets (N,), weight (V, P), bias (V,) -> (N,).
    """
    out = []
    for s in range(0, h.shape[0], chunk):
        logits = _at_least_fp32(torch.addmm(bias, h[s : s + chunk], weight.t()))  # (n, V)
        out.append(F.cross_entropy(logits, targets[s : s + chunk], reduction="none"))
    return torch.cat(out) if out else h.new_zeros(0)
