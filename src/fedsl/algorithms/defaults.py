"""The paper's default hyper-parameter rules (Section 4.1, 'Implementation').

E_c = 1, E_s = ⌈n/(N·n0)·E_c⌉, B0 = B, η_g = √S, η0 = √S·η_l·K/K0, γ = 1.
These make the server's effective step per round match the clients' (K0·η0 = K·η_l·η_g,
the step-size condition of Theorem 1).
"""

from __future__ import annotations

import math

GAMMA = 1.0
LOCAL_EPOCHS = 1
PRETRAIN_LR = 0.01
PRETRAIN_EPOCHS = 500


def server_epochs(n: int, num_clients: int, n0: int, local_epochs: int = LOCAL_EPOCHS) -> int:
    """E_s = ⌈n / (N·n0) · E_c⌉: the server sees as many samples per round as a mean client."""
    return math.ceil(n / (num_clients * n0) * local_epochs - 1e-12)


def global_lr(clients_per_round: int) -> float:
    """η_g = √S."""
    return math.sqrt(clients_per_round)


def server_lr(clients_per_round: int, local_lr: float, local_steps: int, server_steps: int) -> float:
    """η0 = √S · η_l · K / K0 (√S: η_g's default, ``global_lr``)."""
    return global_lr(clients_per_round) * local_lr * local_steps / server_steps

