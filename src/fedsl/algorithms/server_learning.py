"""Server learning's settings: γ, η0, B0, K0, and whether the server steps after the clients or beside them.

Server learning is Algorithm 1's line 10: K0 SGD steps of step size γ·η0 on the server's data D0, every round
(the server's round that runs it: ``server_round``).

Incremental (FSL): x_{t+1} = LocalSGD(x̄_t, γ·η0, K0, D0), i.e. K0 SGD steps on the
server's data from the *aggregated* model. The weight γ on f0 enters only as a factor
of the step size, so the rounds approximate the incremental gradient method on
F + γ f0 (paper Section 2).

Parallel (FSL-p, "non-incremental"): the server trains from x_t on D0 like one more
client and its update Δ_0 is averaged in with weight w0 (default n0 / (n0 + Σ_{i∈S} n_i),
the share of its data in the round). We keep γ·η0 as its step size so that FSL and FSL-p
are compared at the same γ, as in the paper's appendix figures.

γ may move over the rounds (``gamma_schedule``). This module holds settings only: it imports nothing of
``fedsl.algorithms`` but the γ schedule, so that the rules that read them (FedDU) and the composed
``algorithm.Algorithm`` sit above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fedsl.algorithms.gamma_schedule import GammaSchedule


@dataclass(frozen=True)
class ServerLearning:
    """Hyper-parameters of server learning.

    Attributes:
        gamma: γ, weight of the server loss f0 (step-size factor). γ = 0 turns SL off.
        lr: η0, server base step size; the step actually taken is γ·η0.
        batch_size: B0, server mini-batch size.
        epochs: E_s, server epochs over D0 per round.
        steps: K0, server steps per round; overrides ``epochs`` when set (0 turns SL off).
        mode: "incremental" (FSL, Algorithm 1) or "parallel" (FSL-p).
        weight: w0, FSL-p only: the server update's weight in the average
            (None: n0 relative to the sampled clients' data).
        schedule: γ_t over the rounds (default constant γ, as in the paper).
        log_angle: measure cos θ_t between -∇f0 and the clients' update each round
            (always on for the adaptive schedule; costs one full gradient on D0).
    """

    gamma: float
    lr: float
    batch_size: int
    epochs: int
    steps: int | None = None
    mode: Literal["incremental", "parallel"] = "incremental"
    weight: float | None = None
    schedule: GammaSchedule | None = None
    log_angle: bool = False

    @property
    def active(self) -> bool:
        return self.gamma > 0 and self.steps != 0

    @property
    def incremental(self) -> bool:
        """Whether every round ends with line 10 (on, incremental mode): an engine may plan its K0 batches ahead."""
        return self.active and self.mode == "incremental"

    @property
    def gamma_schedule(self) -> GammaSchedule:
        return self.schedule or GammaSchedule("constant")

    def gamma_at(self, t: int, current: float | None) -> float:
        """γ_t of round t; ``current`` is the run's running γ (``RunState.gamma``, the adaptive schedule's)."""
        return self.gamma_schedule.value(t, self.gamma, current)

    @property
    def measures_angle(self) -> bool:
        return self.log_angle or self.gamma_schedule.kind == "adaptive"

    def parallel_weight(self, n0: int, client_sizes: list[int]) -> float:
        """w0 for FSL-p: the configured weight, or n0 / (n0 + Σ n_i)."""
        if self.weight is not None:
            return self.weight
        return n0 / (n0 + sum(client_sizes))


@dataclass(frozen=True)
class Pretraining:
    """Server pretraining on D0 before round 1 (paper: SGD, lr 0.01, 500 epochs, batch B)."""

    epochs: int
    lr: float
    batch_size: int


def round_steps(steps: int | None, epochs: int, n0: int, batch_size: int) -> int:
    """K0 of line 10: ``steps`` when given, else E_s·⌈n0/B0⌉ (the batch plan's count): the formula, written once."""
    return steps if steps is not None else epochs * math.ceil(n0 / batch_size)


def server_steps(sl: ServerLearning, n0: int) -> int:
    """K0 of ``sl``'s line 10 on n0 server samples (``round_steps``)."""
    return round_steps(sl.steps, sl.epochs, n0, sl.batch_size)
