"""FSL-p: non-incremental server learning (paper Section 2; Yoshida et al. 2020).

The server trains from x_t on D0 in parallel with the clients, like one more client,
and its update Δ_0 enters the average with weight w0 (default n0 / (n0 + Σ_{i∈S} n_i)):
x_{t+1} = x_t + η_g·((1 - w0)·mean_i Δ_i + w0·Δ_0). Its step size is γ·η0 with K0 steps,
as in FSL, so both are compared at equal γ.
"""

from __future__ import annotations

from dataclasses import replace

from fedsl.algorithms.base import Algorithm, LocalTraining
from fedsl.algorithms.server_learning import ServerLearning


def make(local: LocalTraining, global_lr: float, server: ServerLearning, weighted: bool = False) -> Algorithm:
    """FSL-p; ``server.weight`` is w0 (None: the n0 rule)."""
    return Algorithm("fsl_p", local, global_lr, weighted, server_learning=replace(server, mode="parallel"))
