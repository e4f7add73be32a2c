"""The stacked bidirectional LSTM with projection, cell clipping and projection clipping.

Both directions run together as batched matrix products. Rows are sorted by length so that the
rows still running at step t are a prefix (the active set shrinks as sentences end); the backward
direction reads each sentence reversed within its own length, so it has the same active set.
Padded positions neither change the state nor emit output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import LstmConfig


@dataclass
class LstmState:
    """Per-row recurrent state of every layer and direction.

    Shape: h (L, 2, B, P), c (L, 2, B, C); direction 0 forward, 1 backward.
    """

    h: torch.Tensor
    c: torch.Tensor

    def detach(self) -> "LstmState":
        return LstmState(self.h.detach(), self.c.detach())


def lstm_step(gates: torch.Tensor, c_prev: torch.Tensor, w_proj: torch.Tensor,
              cell_clip: float | None, proj_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step from its pre-activations (TF gate order i, j, f, o; forget offset already in).

    Shape: gates (D, N, 4C), c_prev (D, N, C), w_proj (D, C, P) -> h (D, N, P), c (D, N, C).
    """
    i, j, f, o = gates.chunk(4, dim=-1)  # (D, N, C) each
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(j)  # (D, N, C)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    h = torch.bmm(torch.sigmoid(o) * torch.tanh(c), w_proj)  # (D, N, P)
    if proj_clip is not None:
        h = h.clamp(-proj_clip, proj_clip)
    return h, c


def reverse_index(lengths: torch.Tensor, t_max: int) -> torch.Tensor:
    """Index that reverses each row within its length and leaves padding in place (self-inverse).

    Shape: lengths (B,) -> (T, B) long.
    """
    t = torch.arange(t_max, device=lengths.device)[:, None]  # (T, 1)
    rev = lengths[None, :] - 1 - t  # (T, B)
    return torch.where(t < lengths[None, :], rev, t)


def _reverse(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Shape: x (T, B, D), index (T, B) -> (T, B, D)."""
    return torch.gather(x, 0, index[:, :, None].expand_as(x))


class BiLstmStack(nn.Module):
    """L layers of forward and backward LSTMs with projection; residual connections above layer 0.

    Parameters are stored as the original stores them (TF orientation, gate order i, j, f, o); the
    +1 forget bias of the original is added at run time, so weight files round-trip bit-exactly.
    """

    def __init__(self, cfg: LstmConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        L, P, C = cfg.n_layers, cfg.projection_dim, cfg.dim
        self.w_input = nn.Parameter(torch.empty(L, 2, P, 4 * C))  # (L, 2, P, 4C): W_0[:P]
        self.w_state = nn.Parameter(torch.empty(L, 2, P, 4 * C))  # (L, 2, P, 4C): W_0[P:]
        self.bias = nn.Parameter(torch.zeros(L, 2, 4 * C))  # (L, 2, 4C): B
        self.w_proj = nn.Parameter(torch.empty(L, 2, C, P))  # (L, 2, C, P): W_P_0
        self.dropout = dropout
        forget = torch.zeros(4 * C)
        forget[2 * C : 3 * C] = 1.0  # TF LSTMCell adds forget_bias=1.0 to gate f at run time
        self.register_buffer("forget_offset", forget, persistent=False)

    def zero_state(self, batch: int) -> LstmState:
        L, P, C = self.cfg.n_layers, self.cfg.projection_dim, self.cfg.dim
        w = self.w_input
        return LstmState(w.new_zeros(L, 2, batch, P), w.new_zeros(L, 2, batch, C))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                state: LstmState | None = None) -> tuple[list[torch.Tensor], LstmState]:
        """Run every layer over length-masked rows.

        Shape: x (B, T, P) zero at padding, lengths (B,) -> L tensors (B, T, 2P), final state.
        """
        B, T, _ = x.shape
        order = torch.argsort(lengths, descending=True, stable=True)  # (B,)
        lengths_sorted = lengths[order]
        rev = reverse_index(lengths_sorted, T)  # (T, B)
        fwd = x[order].transpose(0, 1)  # (T, B, P)
        xs = torch.stack([fwd, _reverse(fwd, rev)])  # (2, T, B, P)
        active = [int(n) for n in (lengths_sorted[None, :] > torch.arange(T)[:, None]).sum(1).tolist()]
        state = state if state is not None else self.zero_state(B)
        h0, c0 = state.h[:, :, order], state.c[:, :, order]  # (L, 2, B, P), (L, 2, B, C)
        outputs, h_fin, c_fin = [], [], []
        for layer in range(self.cfg.n_layers):
            if self.training and self.dropout > 0:
                xs = nn.functional.dropout(xs, self.dropout, training=True)
            out, h, c = self._run_layer(layer, xs, active, h0[layer], c0[layer])  # (2, T, B, P)
            if layer > 0 and self.cfg.use_skip_connections:
                out = out + xs  # residual: the layer's input is added to its output
            outputs.append(out)
            h_fin.append(h)
            c_fin.append(c)
            xs = out
        inverse = torch.argsort(order)
        layers = [self._to_batch_major(o, rev)[inverse] for o in outputs]  # [(B, T, 2P)]
        final = LstmState(torch.stack(h_fin)[:, :, inverse], torch.stack(c_fin)[:, :, inverse])
        return layers, final

    @staticmethod
    def _to_batch_major(out: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
        """Shape: (2, T, B, P) -> (B, T, 2P), the backward half put back in reading order."""
        both = torch.cat([out[0], _reverse(out[1], rev)], dim=-1)  # (T, B, 2P)
        return both.transpose(0, 1)

    def _run_layer(self, layer: int, xs: torch.Tensor, active: list[int], h: torch.Tensor,
                   c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Shape: xs (2, T, B, P), h (2, B, P), c (2, B, C) -> out (2, T, B, P), h, c."""
        D, T, B, P = xs.shape
        bias = (self.bias[layer] + self.forget_offset)[:, None, :]  # (2, 1, 4C)
        gx = torch.baddbmm(bias, xs.reshape(D, T * B, P), self.w_input[layer])  # (2, T*B, 4C)
        gx = gx.view(D, T, B, -1)  # (2, T, B, 4C)
        w_state, w_proj = self.w_state[layer], self.w_proj[layer]
        out = xs.new_zeros(D, T, B, P)  # (2, T, B, P)
        clips = (self.cfg.cell_clip, self.cfg.proj_clip)
        for t in range(T):
            n = active[t]
            if n == 0:
                break
            gates = torch.baddbmm(gx[:, t, :n], h[:, :n], w_state)  # (2, n, 4C)
            h_new, c_new = lstm_step(gates, c[:, :n], w_proj, *clips)
            out[:, t, :n] = h_new
            # Finished rows keep their state; no in-place update, so autograd works too.
            h = h_new if n == B else torch.cat([h_new, h[:, n:]], dim=1)  # (2, B, P)
            c = c_new if n == B else torch.cat([c_new, c[:, n:]], dim=1)  # (2, B, C)
        return out, h, c
