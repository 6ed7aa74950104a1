"""Character LSTMs for next-character prediction (Shakespeare: McMahan et al. 2017; LEAF, Caldas et al. 2018).

``char_lstm`` is the FedAvg paper's and LEAF's model: each of the L input characters embedded in 8 dimensions, two
LSTM layers of 256 units, and a dense layer from the last step's output to the V = 80 characters' logits (the
softmax is folded into the cross-entropy loss). ``char_lstm_small`` has two layers of 64, for CPU runs.

The LSTM layers are ``nn.LSTM``'s (its fused kernels) under plain autograd (the sequential executor and the
process pool), but under a ``torch.func`` transform the same parameters run through ``lstm``, the LSTM written from
plain operations: the vectorised and stacked executors vmap the model over clients, where ``nn.LSTM`` has no
batching rule (it falls back to a loop), and ``fedsl data assess`` takes Hessian-vector products by forward-mode
autodiff, which ``nn.LSTM``'s kernel does not implement. The two are equal to float rounding (tested to 1e-5).
"""

from __future__ import annotations

import torch
from torch import nn


def lstm(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
         ) -> torch.Tensor:
    """``nn.LSTM(batch_first=True)`` from plain operations: x [B, T, in] -> the last layer's outputs [B, T, H].

    ``layers``: each layer's (W_ih [4H, in], W_hh [4H, H], b_ih [4H], b_hh [4H]), gates in PyTorch's order
    (input, forget, cell, output); h_0 = c_0 = 0.
    """
    for w_ih, w_hh, b_ih, b_hh in layers:
        pre = x @ w_ih.T + (b_ih + b_hh)  # every step's input part in one product
        hidden = w_hh.shape[1]
        h = torch.zeros_like(pre[:, 0, :hidden])
        c = torch.zeros_like(h)
        outputs = []
        # the steps' slices in one op: a slice ``pre[:, t]`` per step would give its backward a zero tensor of all T
        # steps each time (under vmap they were all alive at once: memory and time grew as T², 2.3 GB for 10
        # clients of 80 characters); unbind's backward is one stack
        for pre_t in pre.unbind(1):
            i, f, g, o = (pre_t + h @ w_hh.T).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        x = torch.stack(outputs, dim=1)
    return x


def transformed(t: torch.Tensor) -> bool:
    """Whether ``t`` is seen through a torch.func transform (vmap, grad, jvp)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(t)


class CharLSTM(nn.Module):
    """Characters [B, L] (indices < V, any integer dtype) -> logits [B, V] of the character after them.

    Exposes its representation z (the last step's output of the last LSTM layer): ``features(x) -> z``,
    ``head(z) -> logits`` (what MOON's contrastive term reads).
    """

    def __init__(self, vocab: int = 80, embedding: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def _layers(self) -> list[tuple[torch.Tensor, ...]]:
        return [tuple(getattr(self.lstm, f"{w}_l{k}") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
                for k in range(self.lstm.num_layers)]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x.long())
        if transformed(e):  # torch.func: plain operations (nn.LSTM's kernel has no batching rule, no forward AD)
            return lstm(e, self._layers())[:, -1]
        return self.lstm(e)[0][:, -1]

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.out(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def char_lstm(num_classes: int = 80) -> CharLSTM:
    """The FedAvg paper's / LEAF's: embedding 8, 2 × LSTM 256, dense to the V = ``num_classes`` characters."""
    return CharLSTM(num_classes, 8, 256, 2)


def char_lstm_small(num_classes: int = 80) -> CharLSTM:
    """For CPU runs: embedding 8, 2 × LSTM 64, dense to the V = ``num_classes`` characters."""
    return CharLSTM(num_classes, 8, 64, 2)
