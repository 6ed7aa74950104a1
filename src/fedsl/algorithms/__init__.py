"""Algorithms as pure update rules (see ``base.Algorithm``).

- ``fedavg``: clients' LocalSGD, x̄ = x + η_g·mean Δ_i.
- ``fsl``: FedAvg + K0 server SGD steps on D0 with step γ·η0 (Algorithm 1).
- ``fsl_p``: FedAvg + the server as one more weighted client (non-incremental SL).
- ``ds``: FedAvg where clients train on D_i ∪ D0 (data sharing).
"""

from __future__ import annotations

from fedsl.algorithms import ds, fsl, fsl_p
from fedsl.algorithms.base import Algorithm, LocalTraining
from fedsl.algorithms.server_learning import Pretraining, ServerLearning

ALGORITHMS = ("fedavg", "fsl", "fsl_p", "ds")


def make_algorithm(name: str, local: LocalTraining, global_lr: float, server: ServerLearning | None,
                   weighted: bool = False) -> Algorithm:
    """Build algorithm ``name``; ``server`` is required for fsl and fsl_p."""
    if name == "fedavg":
        return Algorithm("fedavg", local, global_lr, weighted)
    if name == "ds":
        return ds.make(local, global_lr, weighted)
    if name in ("fsl", "fsl_p"):
        if server is None:
            raise ValueError(f"algorithm.name = {name!r} needs server data (data.server_size > 0)")
        return (fsl if name == "fsl" else fsl_p).make(local, global_lr, server, weighted)
    raise ValueError(f"algorithm.name = {name!r}: expected one of {list(ALGORITHMS)}")


__all__ = ["ALGORITHMS", "Algorithm", "LocalTraining", "Pretraining", "ServerLearning", "make_algorithm"]
