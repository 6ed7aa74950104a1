"""Algorithms as pure update rules (see ``base``).

- ``fedavg``: clients' LocalSGD, x̄ = x + η_g·mean Δ_i.
- ``fsl``: FedAvg + K0 server SGD steps on D0 with step γ·η0 (Algorithm 1).
- ``fsl_p``: FedAvg + the server as one more weighted client (non-incremental SL).
- ``ds``: FedAvg where clients train on D_i ∪ D0 (data sharing).
- ``scaffold``, ``feddyn``, ``fedprox``, ``fedavgm``, ``fedadam``: the baselines; any of
  them composes with server learning (``server_learning``), e.g. SCAFFOLD + SL.
"""

from __future__ import annotations

from dataclasses import replace

from fedsl.algorithms.base import Algorithm, Correction, LocalTraining, RoundContext, ServerRule, State
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.feddyn import FedDyn
from fedsl.algorithms.fedopt import FedAdam, FedAvgM
from fedsl.algorithms.fedprox import FedProx
from fedsl.algorithms.gamma_schedule import GammaSchedule
from fedsl.algorithms.scaffold import Scaffold
from fedsl.algorithms.server_learning import Pretraining, ServerLearning

ALGORITHMS = ("fedavg", "fsl", "fsl_p", "ds", "fedprox", "fedavgm", "fedadam", "scaffold", "feddyn")
# rules whose aggregate is a weighted mean of updates, where FSL-p's server "client" can join the mean
PARALLEL_OK = ("fedavg", "fedprox", "fedavgm", "fedadam")


def make_rule(name: str, global_lr: float, **hp) -> ServerRule:
    """The server rule of algorithm ``name`` (fsl, fsl_p and ds use FedAvg's)."""
    if name in ("fedavg", "fsl", "fsl_p", "ds"):
        return FedAvg(global_lr)
    if name == "fedprox":
        return FedProx(global_lr, mu=hp.get("mu", 0.01))
    if name == "fedavgm":
        return FedAvgM(global_lr, momentum=hp.get("momentum", 0.9))
    if name == "fedadam":
        return FedAdam(global_lr, beta1=hp.get("beta1", 0.9), beta2=hp.get("beta2", 0.99), tau=hp.get("tau", 1e-3))
    if name == "scaffold":
        return Scaffold(global_lr)
    if name == "feddyn":
        return FedDyn(alpha=hp.get("alpha", 0.01))
    raise ValueError(f"algorithm.name = {name!r}: expected one of {list(ALGORITHMS)}")


def make_algorithm(name: str, local: LocalTraining, global_lr: float, server: ServerLearning | None,
                   weighted: bool = False, **hp) -> Algorithm:
    """Build algorithm ``name``.

    - fsl: FedAvg + ``server`` as incremental SL (Algorithm 1); fsl_p: FedAvg + ``server``
      as parallel SL (FSL-p). Both require ``server``.
    - ds: FedAvg with clients training on D_i ∪ D0 (Zhao et al. 2018).
    - any other rule: ``server``, when given, runs after its server update (e.g. SCAFFOLD + SL).
    ``hp`` holds the rules' own hyper-parameters (mu, momentum, beta1, beta2, tau, alpha).
    """
    rule = make_rule(name, global_lr, **hp)
    if name in ("fsl", "fsl_p"):
        if server is None:
            raise ValueError(f"algorithm.name = {name!r} needs server data (data.server_size > 0)")
        server = replace(server, mode="parallel" if name == "fsl_p" else "incremental")
    if server is not None and server.mode == "parallel" and rule.name not in PARALLEL_OK:
        raise ValueError(f"parallel server learning (FSL-p) composes with {', '.join(PARALLEL_OK)}, not {name!r}")
    return Algorithm(name, local, rule, weighted, server_learning=server, share_server_data=name == "ds")


__all__ = ["ALGORITHMS", "Algorithm", "Correction", "FedAdam", "FedAvg", "FedAvgM", "FedDyn", "FedProx",
           "GammaSchedule", "LocalTraining", "Pretraining", "RoundContext", "Scaffold", "ServerLearning",
           "ServerRule", "State", "make_algorithm", "make_rule"]
