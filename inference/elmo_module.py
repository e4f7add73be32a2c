"""ELMo in a task model, as the paper's section 3.3 uses it: a drop-in for AllenNLP's
``allennlp.modules.elmo.Elmo``.

The biLM is run once per batch and each of ``num_output_representations`` task-specific scalar
mixes (``s^task``, ``gamma^task``) combines its L+1 layers, followed by dropout. The biLM stays
in eval mode (no dropout inside it, as in AllenNLP), frozen unless ``requires_grad``. ``ElmoMix``
is the mixing half alone, for layers computed ahead of time (``elmo embed --output all`` and
``pipelines.ElmoLayersDataset``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from elmo_core import BiLM, ScalarMix, StatefulBiLM
from elmo_core.errors import InputError
from formats import load_bilm


class ElmoMix(nn.Module):
    """``num_output_representations`` independent trainable scalar mixes, each followed by dropout.

    ``scalar_mix_parameters`` fixes every mix's (pre-softmax) weights and gamma (not trained), as
    AllenNLP's does. ``do_layer_norm`` normalises each layer over the batch's unmasked values first.
    ``l2_coefficient``: ``regularization_penalty()`` is ``lambda * sum_k ||s_k||^2`` over the
    unnormalised weights, as bilm-tf's ``weight_layers`` adds it to the task loss.

    Shape: layers (B, L+1, T, D), mask (B, T) -> K tensors (B, T, D).
    """

    def __init__(self, n_layers: int, num_output_representations: int, dropout: float = 0.5,
                 do_layer_norm: bool = False, scalar_mix_parameters: Sequence[float] | None = None,
                 l2_coefficient: float = 0.0) -> None:
        super().__init__()
        if num_output_representations < 1:
            raise InputError(f"num_output_representations must be >= 1, got {num_output_representations}")
        if not 0.0 <= dropout < 1.0:
            raise InputError(f"dropout must be in [0, 1), got {dropout}")
        trainable = scalar_mix_parameters is None
        self.mixes = nn.ModuleList(
            ScalarMix(n_layers, scalar_mix_parameters, do_layer_norm=do_layer_norm, trainable=trainable)
            for _ in range(num_output_representations))
        self.dropout = nn.Dropout(dropout)
        self.l2_coefficient = l2_coefficient

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        return [self.dropout(mix(layers, mask)) for mix in self.mixes]  # K x (B, T, D)

    def regularization_penalty(self) -> torch.Tensor:
        """Shape: () — add it to the task loss."""
        return self.l2_coefficient * sum(mix.scalars.pow(2).sum() for mix in self.mixes)


class Elmo(nn.Module):
    """The biLM and an ``ElmoMix``; ``forward(inputs)`` returns ``{"elmo_representations": K x
    (..., T, D), "mask": (..., T) bool}``. ``inputs``: tokenized sentences (a list of lists of
    ``str``), or character ids (``(..., T, C)`` integers, a torch tensor or a numpy array, as
    ``elmo_core.batch_to_ids`` or AllenNLP's ``batch_to_ids`` give them); anything else is an
    ``InputError``.

    AllenNLP's arguments and defaults. Differences: the biLM is stateless unless ``stateful``
    (AllenNLP's carries each row's LSTM state into the next batch, which makes a sentence's
    vectors depend on the batches before it); ``vocab_to_cache`` is replaced by the token cache
    (``token_embeddings``, see ``inference.backends.TorchBackend``), which needs no word ids;
    ``l2_coefficient`` is ours (see ``ElmoMix``).

    Shape: (B, T, C) ids -> K x (B, T, D), mask (B, T).
    """

    def __init__(self, options_file: str | Path, weight_file: str | Path | None, num_output_representations: int,
                 requires_grad: bool = False, do_layer_norm: bool = False, dropout: float = 0.5,
                 keep_sentence_boundaries: bool = False, scalar_mix_parameters: Sequence[float] | None = None,
                 l2_coefficient: float = 0.0, stateful: bool = False, module: BiLM | None = None) -> None:
        super().__init__()
        self.bilm = module if module is not None else load_bilm(options_file, weight_file)
        self.bilm.eval().requires_grad_(requires_grad)
        self.requires_grad = requires_grad
        self.stateful = StatefulBiLM(self.bilm) if stateful else None
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.mix = ElmoMix(self.bilm.config.n_output_layers, num_output_representations, dropout, do_layer_norm,
                           scalar_mix_parameters, l2_coefficient)

    def get_output_dim(self) -> int:
        return self.bilm.config.output_dim

    def train(self, mode: bool = True) -> "Elmo":
        super().train(mode)
        self.bilm.eval()  # no dropout inside the biLM, in training too (AllenNLP's has none)
        return self

    def forward(self, inputs: torch.Tensor | np.ndarray | Sequence[Sequence[str]]) -> dict:
        ids = self._char_ids(inputs)  # (..., T, C)
        lead, (T, C) = ids.shape[:-2], ids.shape[-2:]  # C: ids a token (its characters, +1 with words)
        if ids.numel() == 0:  # no sentence, or no token in any: nothing to run
            return self._empty(lead, T + 2 if self.keep_sentence_boundaries else T, ids.device)
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            out = self._run(ids.reshape(-1, T, C))  # layers (B, L+1, T+2, D), mask (B, T+2)
        layers, full_mask = out.layers, out.mask
        representations = self.mix(layers, full_mask)  # K x (B, T+2, D): the statistics of
        # do_layer_norm include the boundary tokens, as in AllenNLP, which mixes before removing them
        if self.keep_sentence_boundaries:
            mask = full_mask
        else:
            mask = (ids.reshape(-1, T, C) > 0).any(-1)  # (B, T)
            representations = [r[:, 1 : T + 1] * mask[:, :, None].to(r.dtype) for r in representations]
        width = mask.shape[-1]
        return {"elmo_representations": [r.reshape(*lead, width, -1) for r in representations],
                "mask": mask.reshape(*lead, width)}

    def _empty(self, lead: torch.Size, width: int, device: torch.device) -> dict:
        """``forward``'s answer for a batch without tokens: K zero tensors (..., width, D), mask all False."""
        D = self.get_output_dim()
        return {"elmo_representations": [torch.zeros(*lead, width, D, device=device) for _ in self.mix.mixes],
                "mask": torch.zeros(*lead, width, dtype=torch.bool, device=device)}

    def _run(self, ids: torch.Tensor):  # type: ignore[no-untyped-def]
        if self.stateful is not None:
            return self.stateful.run(ids, keep_boundaries=True)
        return self.bilm.run(ids, keep_boundaries=True)

    def regularization_penalty(self) -> torch.Tensor:
        return self.mix.regularization_penalty()

    def reset_states(self) -> None:
        """Start every row from a zero state again (stateful only)."""
        if self.stateful is not None:
            self.stateful.reset()

    def _check_id_range(self, ids: torch.Tensor) -> None:
        """Character ids index the char embedding's ``char_rows`` rows (0: padding); none negative."""
        if ids.numel() == 0:
            return
        chars, rows = ids[..., : self.bilm.config.char_cnn.max_characters_per_token], self.bilm.config.char_rows
        low, high = int(ids.min()), int(chars.max())
        if low < 0 or high >= rows:
            bad = low if low < 0 else high
            raise InputError(f"inputs: character id {bad} is outside 0..{rows - 1} (this model's {rows} character "
                             f"rows; 0 pads): make the ids with this model's batch_to_ids, or pass tokenized sentences")

    def _char_ids(self, inputs: torch.Tensor | np.ndarray | Sequence[Sequence[str]]) -> torch.Tensor:
        device = next(self.bilm.parameters()).device
        if isinstance(inputs, np.ndarray):
            if not np.issubdtype(inputs.dtype, np.integer):
                raise InputError(f"inputs: a numpy array must hold integer character ids, got dtype {inputs.dtype}; "
                                 f"pass tokenized sentences (lists of str) instead")
            inputs = torch.from_numpy(np.ascontiguousarray(inputs))
        if isinstance(inputs, torch.Tensor):
            if inputs.dim() < 3 or inputs.shape[-1] != self.bilm.config.token_width:
                raise InputError(f"inputs: expected character ids (..., T, {self.bilm.config.token_width}), "
                                 f"got {tuple(inputs.shape)}")
            if inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool:
                raise InputError(f"inputs: character ids are integers, got {inputs.dtype}")
            self._check_id_range(inputs)
            return inputs.to(device)
        if isinstance(inputs, str) or any(isinstance(s, str) for s in inputs):
            raise InputError("inputs: a batch of tokenized sentences (a list of lists of str), got a list of str; "
                             "wrap one sentence as [tokens]")
        ids = self.bilm.tokenizer.batch(inputs)  # (B, T, W)
        return torch.from_numpy(ids).to(device)
