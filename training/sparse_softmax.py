"""Sparse softmax updates for the sampled softmax: a step reads, and updates, only the rows of the
(V, P) softmax it predicts or samples, as bilm-tf does (TF applies the sampled softmax's
IndexedSlices gradient with sparse Adagrad). Without this, a step with the published 793k-word
vocabulary reads and writes the whole softmax, its gradient and its optimizer state.

Per step: ``SparseSoftmax.gather`` copies the rows (sorted distinct ids) into leaf tensors that the
loss reads; after backward, ``reduce`` sums their gradients over data-parallel ranks (each rank's
rows differ with its targets); the global-norm clip includes them (``clip_grad_norm_``); ``step``
applies the optimizer to those rows only:

* Adagrad: exactly what dense Adagrad computes, since a row with a zero gradient neither moves
  nor changes its accumulator (tested: sparse == dense, bit for bit).
* Adam: lazy Adam (torch's ``SparseAdam``, TF's ``LazyAdamOptimizer``). A row's moments change only
  on the steps that read it, and the bias correction counts every step. Dense Adam would also
  decay every row's moments each step and move every row with its momentum. A row read on every
  step gets dense Adam's update (tested).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from elmo_core.host_to_device import to_device

from .distributed import DistInfo
from .objective import Candidates

ADAM_BETAS, ADAM_EPS, ADAGRAD_EPS, ADAGRAD_INIT = (0.9, 0.999), 1e-8, 1e-10, 1.0


@dataclass
class SoftmaxRows:
    """The rows of the softmax one step reads.

    Shape: ids (R,) sorted distinct vocabulary ids; w (R, P) and b (R,) leaves (their .grad after
    backward is the step's softmax gradient).
    """

    ids: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor


class SparseSoftmax:
    """The softmax rows' optimizer: ``adagrad`` (accumulator 1.0) or ``adam`` (lazy), the recipe's
    (``training.optim.OPTIMIZERS``, checked there)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter, optimizer: str) -> None:
        self.weight, self.bias, self.optimizer, self.steps = weight, bias, optimizer, 0
        if optimizer == "adagrad":
            self.state = {"sum_w": torch.full_like(weight, ADAGRAD_INIT), "sum_b": torch.full_like(bias, ADAGRAD_INIT)}
        else:
            self.state = {"m_w": torch.zeros_like(weight), "v_w": torch.zeros_like(weight),
                          "m_b": torch.zeros_like(bias), "v_b": torch.zeros_like(bias)}

    def gather(self, targets: torch.Tensor, candidates: tuple[Candidates, Candidates]) -> SoftmaxRows:
        """The rows of the step's targets (both directions, padding masked out) and candidates.

        Shape: targets (M,) -> SoftmaxRows with R <= M + 2S rows.
        Built on the host from host ``targets`` and candidates (finding the distinct ids reads them),
        then copied to the device without a host wait.
        """
        ids = to_device(torch.unique(torch.cat([targets.reshape(-1).cpu(), candidates[0].ids.cpu(),
                                                candidates[1].ids.cpu()])), self.weight.device)  # (R,)
        return SoftmaxRows(ids, self.weight.detach()[ids].requires_grad_(), self.bias.detach()[ids].requires_grad_())

    def grads(self, rows: SoftmaxRows) -> list[torch.Tensor]:
        """The rows' gradients (zeros where the loss did not reach them). Shape: [(R, P), (R,)]."""
        return [t.grad if t.grad is not None else torch.zeros_like(t) for t in (rows.w, rows.b)]

    def reduce(self, info: DistInfo, rows: SoftmaxRows) -> SoftmaxRows:
        """The mean over ranks of the rows' gradients (as DDP averages the dense ones), on the union
        of the ranks' rows; the rows themselves when there is one rank."""
        if not info.enabled:
            return rows
        gw, gb = self.grads(rows)
        ids, values = all_rows_sum(rows.ids, torch.cat([gw, gb[:, None]], 1))  # (U,), (U, P+1)
        values /= info.world
        merged = SoftmaxRows(ids, self.weight.detach()[ids], self.bias.detach()[ids])
        merged.w.grad, merged.b.grad = values[:, :-1].contiguous(), values[:, -1].contiguous()
        return merged

    @torch.no_grad()
    def step(self, rows: SoftmaxRows, lr: float) -> None:
        """Update the rows of the weight, the bias and their optimizer state."""
        self.steps += 1
        for param, grad, key in zip((self.weight, self.bias), self.grads(rows), ("w", "b")):
            if self.optimizer == "adagrad":
                self._adagrad(param, grad, rows.ids, self.state[f"sum_{key}"], lr)
            else:
                self._adam(param, grad, rows.ids, self.state[f"m_{key}"], self.state[f"v_{key}"], lr)

    @staticmethod
    def _adagrad(param: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor, acc: torch.Tensor, lr: float) -> None:
        """torch.optim.Adagrad's update (lr_decay 0, eps 1e-10) on the rows ``ids``."""
        s = acc[ids].addcmul_(grad, grad, value=1)  # (R, ...)
        acc[ids] = s
        param[ids] = param[ids].addcdiv_(grad, s.sqrt().add_(ADAGRAD_EPS), value=-lr)

    def _adam(self, param: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor, m: torch.Tensor,
              v: torch.Tensor, lr: float) -> None:
        """torch.optim.Adam's update (betas 0.9, 0.999, eps 1e-8) on the rows ``ids``."""
        (b1, b2), t = ADAM_BETAS, self.steps
        m_rows = m[ids].lerp_(grad, 1 - b1)
        v_rows = v[ids].mul_(b2).addcmul_(grad, grad, value=1 - b2)
        m[ids], v[ids] = m_rows, v_rows
        denom = (v_rows.sqrt() / math.sqrt(1 - b2 ** t)).add_(ADAM_EPS)
        param[ids] = param[ids].addcdiv_(m_rows, denom, value=-lr / (1 - b1 ** t))

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        return {f"softmax_opt.{k}": v for k, v in self.state.items()}, {"optimizer": self.optimizer, "steps": self.steps}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        for k in self.state:
            self.state[k].copy_(tensors[f"softmax_opt.{k}"])
        self.steps = int(meta["steps"])


def all_rows_sum(ids: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's (ids, values) rows summed by id over ranks (row counts may differ per rank).

    Shape: ids (R,) distinct, values (R, K) -> ids (U,) sorted distinct, values (U, K).
    """
    world = dist.get_world_size()
    counts = [torch.zeros(1, dtype=torch.long, device=ids.device) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([ids.numel()], device=ids.device))
    most = int(max(c.item() for c in counts))
    pad = most - ids.numel()
    all_ids = [torch.empty(most, dtype=ids.dtype, device=ids.device) for _ in range(world)]
    all_values = [values.new_empty(most, values.shape[1]) for _ in range(world)]
    dist.all_gather(all_ids, torch.cat([ids, ids.new_zeros(pad)]))
    dist.all_gather(all_values, torch.cat([values, values.new_zeros(pad, values.shape[1])]))
    keep_ids = torch.cat([t[: int(c.item())] for t, c in zip(all_ids, counts)])  # (sum R,)
    keep_values = torch.cat([t[: int(c.item())] for t, c in zip(all_values, counts)])  # (sum R, K)
    union, inverse = torch.unique(keep_ids, return_inverse=True)
    return union, values.new_zeros(union.numel(), values.shape[1]).index_add_(0, inverse, keep_values)


def clip_grad_norm_(params: list[nn.Parameter], rows: SoftmaxRows, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the dense parameters' gradients and the rows' gradients
    together (the global norm of the whole gradient, as the dense update would see it)."""
    grads = [p.grad for p in params if p.grad is not None] + [t.grad for t in (rows.w, rows.b) if t.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))
    return total
