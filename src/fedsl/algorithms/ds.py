"""DS: FedAvg with data sharing (Zhao et al. 2018).

Every client trains on D'_i = D_i ∪ D0 (the server's data, shared with all clients);
the server only averages. Its objective is F' = n/(n+N·n0)·(F + N·n0/n·f0): FSL with
γ = N·n0/n optimises the same function without moving data.
"""

from __future__ import annotations

from fedsl.algorithms.base import Algorithm, LocalTraining


def make(local: LocalTraining, global_lr: float, weighted: bool = False) -> Algorithm:
    return Algorithm("ds", local, global_lr, weighted, share_server_data=True)
