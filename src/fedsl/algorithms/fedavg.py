"""FedAvg's server rule (McMahan et al. 2017; Algorithm 1, lines 8-9 of the FSL paper)."""

from __future__ import annotations

import torch

from fedsl.engine.functional import Params


def aggregate(x: Params, client_params: Params, weights: torch.Tensor, global_lr: float) -> Params:
    """x̄ = x + η_g · Σ_i w_i Δ_i with Δ_i = x_i - x.

    Args:
        x: the global model x_t.
        client_params: the clients' final models x^{(i)}_{t,K}, stacked on dim 0.
        weights: w_i, summing to 1 (1/S for the plain mean of Algorithm 1, n_i/Σn_j if weighted).
        global_lr: η_g, the server step size (paper default √S).
    """
    out = {}
    for n, p in x.items():
        delta = client_params[n] - p  # Δ_i, [S, ...]
        w = weights.to(delta.dtype).reshape(-1, *([1] * p.dim()))
        out[n] = p + global_lr * (w * delta).sum(0)
    return out


def client_weights(sizes: list[int], weighted: bool) -> torch.Tensor:
    """1/S each (Algorithm 1), or n_i / Σ n_j when ``weighted``."""
    s = torch.tensor(sizes, dtype=torch.float64)
    return s / s.sum() if weighted else torch.full_like(s, 1.0 / len(sizes))
