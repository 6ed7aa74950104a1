"""Non-IIDness diagnostics of the paper (Section 3, Appendix 'Quantifying the non-IIDness').

At a model x, with full-batch gradients (dropout off):
    ξ² = ‖∇f0(x) − ∇F(x)‖²                 quality of the server data D0 (Assumption 3)
    G² = (1/N) Σ_i ‖∇f_i(x) − ∇F(x)‖²        dissimilarity of the clients (Assumption 2)
    cos(∇F, ∇f0)                            the descent condition (Eq. grad_f0_cond_angle) needs > 0
with F = Σ_i (n_i/n) f_i. The clients' gradients are computed together: ``vmap`` over
clients of one gradient function on padded, weighted batches (weights 1/n_i, 0 on
padding), a chunk of clients at a time, never a Python loop over clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import grad, vmap

from fedsl.core.types import Params
from fedsl.data.federation import Federation
from fedsl.engine.functional import FunctionalModel, full_gradient


@dataclass
class Diagnostics:
    xi2: float  # ξ²
    G2: float  # G²
    cos_F_f0: float  # cos of the angle between ∇F and ∇f0


def _dot(a: Params, b: Params) -> torch.Tensor:
    return sum((a[n] * b[n]).sum() for n in a)


# Samples a vmapped gradient call takes at once (clients × padded samples); a larger chunk is taken in blocks of
# samples, each client's gradient their sum (the loss is a weighted sum). Text models keep every step's state for
# the backward pass, about a hundred times an image's activations per sample: a smaller budget.
SAMPLES_PER_CALL = 1 << 16
TEXT_SAMPLES_PER_CALL = 1 << 11


def client_gradients_sum(fm: FunctionalModel, x: Params, fed: Federation, clients: list[np.ndarray],
                         chunk: int = 16) -> tuple[Params, Params, torch.Tensor]:
    """Σ_i ∇f_i, Σ_i (n_i/n)∇f_i and Σ_i ‖∇f_i‖² over ``clients``, vmapped over chunks of clients (each chunk's
    padded samples in blocks of at most ``SAMPLES_PER_CALL``, text's ``TEXT_SAMPLES_PER_CALL``, per call)."""
    fm.train(False)
    dtype = next(iter(x.values())).dtype
    n = sum(len(c) for c in clients)
    per_client = vmap(grad(fm.loss), in_dims=(None, 0, 0, 0, None))
    total = {k: torch.zeros_like(v) for k, v in x.items()}
    weighted = {k: torch.zeros_like(v) for k, v in x.items()}
    sq = torch.zeros((), dtype=dtype, device=fed.x.device)
    for start in range(0, len(clients), chunk):
        part = clients[start:start + chunk]
        m = max(len(c) for c in part)
        idx = np.zeros((len(part), m), dtype=np.int64)
        w = np.zeros((len(part), m))
        for j, c in enumerate(part):
            idx[j, :len(c)], idx[j, len(c):] = c, c[0]
            w[j, :len(c)] = 1.0 / len(c)
        idx_t = torch.as_tensor(idx, device=fed.x.device)
        w_t = torch.as_tensor(w, dtype=dtype, device=fed.x.device)
        budget = SAMPLES_PER_CALL if fed.x.is_floating_point() else TEXT_SAMPLES_PER_CALL
        width = max(1, budget // len(part))
        g = None
        for a in range(0, m, width):  # one block when it fits: the numbers of a single call
            cols = slice(a, a + width)
            block = per_client(x, fed.x[idx_t[:, cols]], fed.y[idx_t[:, cols]], w_t[:, cols], None)
            g = block if g is None else {k: g[k] + block[k] for k in g}  # [chunk, ...] per parameter
        sizes = torch.as_tensor([len(c) / n for c in part], dtype=dtype, device=fed.x.device)
        for k in x:
            total[k] += g[k].sum(0)
            weighted[k] += (sizes.reshape(-1, *([1] * x[k].dim())) * g[k]).sum(0)
            sq += (g[k] ** 2).reshape(len(part), -1).sum(1).sum()
    return total, weighted, sq


def measure(fm: FunctionalModel, x: Params, fed: Federation) -> Diagnostics:
    """ξ², G² and cos(∇F, ∇f0) at ``x`` (needs server data for ξ² and the angle)."""
    N = fed.num_clients
    total, gF, sq = client_gradients_sum(fm, x, fed, fed.clients)
    mean = {k: v / N for k, v in total.items()}
    # (1/N) Σ ‖g_i − ∇F‖² = (1/N) Σ ‖g_i‖² − 2⟨(1/N) Σ g_i, ∇F⟩ + ‖∇F‖²
    G2 = float(sq / N - 2 * _dot(mean, gF) + _dot(gF, gF))
    xi2 = cos = float("nan")
    if fed.n0:
        idx = torch.as_tensor(fed.server, device=fed.x.device)
        g0 = full_gradient(fm, x, fed.x[idx], fed.y[idx])
        diff = {k: g0[k] - gF[k] for k in x}
        xi2 = float(_dot(diff, diff))
        cos = float(_dot(gF, g0) / torch.sqrt(_dot(gF, gF) * _dot(g0, g0)))
    return Diagnostics(xi2, max(G2, 0.0), cos)
