"""FSL: Federated Learning with Server Learning (Algorithm 1 of the paper).

Each round: S sampled clients run K LocalSGD steps (η_l) from x_t; the server forms
x̄_t = x_t + η_g·mean_i Δ_i and then runs K0 SGD steps on D0 with step size γ·η0 from
x̄_t. With γ = 0 (or K0 = 0) it is exactly FedAvg.
"""

from __future__ import annotations

from fedsl.algorithms.base import Algorithm, LocalTraining
from fedsl.algorithms.server_learning import ServerLearning


def make(local: LocalTraining, global_lr: float, server: ServerLearning, weighted: bool = False) -> Algorithm:
    """FSL with client LocalSGD ``local`` (η_l, B, E_c), η_g = ``global_lr`` and SL ``server`` (γ, η0, B0, E_s)."""
    return Algorithm("fsl", local, global_lr, weighted, server_learning=server)
