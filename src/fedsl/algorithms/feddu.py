"""FedDU, the dynamic server update of FedDUAP (Zhang et al., IJCAI 2022, arXiv 2204.11536; restated as
"FedDU" in FedDUMAP, Liu et al., arXiv 2408.05678), and the "D0 only" control.

FedDU is FedAvg followed by training on the server's shared data D0, like FSL's line 10, but with a
size that the server sets every round from how non-IID the round's clients are, how non-IID D0 is,
and how good the aggregated model already is:

    x̄_t     = x_t + η_g · mean_i Δ_i                                        FedAvg (lines 8-9)
    α_t     = (1 - acc_t) · n0·D(P'_t) / (n0·D(P'_t) + n'_t·D(P_0)) · decay^t  the server's share
    τ_eff_t = α_t · τ̄_t                                                      effective server steps
    x_{t+1} = LocalSGD(x̄_t, γ_t·η0, K0, D0),   γ_t = γ · min(1, τ_eff_t / K0)   line 10

- D(P) = JS(P ‖ P_G), the Jensen-Shannon divergence (log base 2, so 0 <= D <= 1) between a label
  distribution P and P_G, the label distribution of all clients' data: the "non-IID degree".
  P'_t: the round's clients' data pooled, n'_t = Σ_{i∈S_t} n_i their samples; P_0: D0's, n0 = |D0|.
- acc_t: the accuracy of x̄_t on D0 (the server measures it on its own data).
- τ̄_t: the mean number of local steps K_i the round's clients took.
- decay ∈ (0, 1] (``algorithm.feddu_decay``; the authors' code's default 0.99, its README's runs 0.999).

What is the paper's and what is our reading. We could not retrieve the papers' text here (only their
abstracts), so we cite no equation numbers. The rule for α_t is taken from the authors' code (PaddleFL,
``python/paddle_fl/mobile/fedDUAP/flearn/experiments/central.py``, ``server_train``: α = (1 - acc)·
n0·D_clients/(n0·D_clients + n'·D_server)·decay^t, acc measured on the shared data, server_iter =
α·avg_iter; ``data/util.py``: D = JS divergence in bits against the clients' overall label
distribution), which matches the papers' description (the server's number of update steps adapted
from the non-IID degrees of the server's and the devices' data, Jensen-Shannon, the model's accuracy
and a decay; FedDUMAP: "normalized server gradients and adaptive steps"). The paper's name for
α·τ̄ is τ_eff, its f'(acc) is 1 - acc in the code; we add no further constant (the code's is 1; γ
plays that role). Ours:
- How τ_eff becomes an update. The authors' code trains E_c epochs on D0 from x̄ (K_s steps) and moves
  x̄ by α_t of the way (x̄ + α_t (x_server - x̄)); the papers speak of a number of server steps. We keep
  FSL's line 10 (K0 planned SGD steps on D0, the same batches in every runtime, so stacked runs and
  Flower stay bit-identical) and scale its step size: γ_t = γ·τ_eff/K0 makes the K0 steps travel about
  as far as τ_eff steps of γ·η0 (to first order in the step size), which is the authors' update to
  first order when their K_s equals τ̄. The cap min(1, ·) mirrors the code's min(actual_iter,
  server_iter).
- η0 defaults to η_l for FedDU (the authors' code trains the server with the clients' lr; ``runner``);
  γ (``server.gamma``, default 1) is an overall factor, and any γ schedule multiplies in.
- A round without client updates (a deployment whose replies were all lost) has no P'_t: γ_t = 0.
- Cost: one forward pass over D0 per round (acc_t). The label counts of the clients are the
  simulator's (the authors' code reads them from the partition too); a deployment's server would need
  each client's label histogram (a privacy cost); fedsl's Flower server rebuilds the federation from
  the seed and reads them there.

"D0 only" (``d0_only``): a control, not a method. The clients are sampled and train as in FedAvg, but
their updates are dropped: x̄_t = x_t, then line 10 as FSL's, so the model sees D0 alone with the same
server steps per round (K0, γ·η0) as FSL. Its trajectory does not depend on the clients' settings;
its client compute is wasted (set ``algorithm.local_steps = 1`` and pin ``server.lr``/``server.steps``
to spend little on it; ``comm_params`` counts none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedsl.algorithms.base import ClientResults, RoundContext
from fedsl.algorithms.fedavg import FedAvg
from fedsl.algorithms.label_counts import LabelCounts
from fedsl.algorithms.server_learning import ServerLearning, server_steps
from fedsl.algorithms.spec import HyperParam, Range, Spec
from fedsl.core.types import Params, State

DECAY = 0.99  # the authors' code's default (--decay)
DECAY_PARAM = HyperParam("feddu_decay", DECAY, "decay", "FedDU's per-round decay of the server update (0 < decay <= 1)",
                         gt=0, le=1, search=Range(0.9, 1.0, hard_high=True))  # FedDU's and FedDUM's (``feddum``)


def label_distribution(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """P: class counts normalised to sum 1 (all zeros stay zeros)."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    return c / total if total > 0 else c


def js_divergence(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray) -> float:
    """JS(p ‖ q) = ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q)/2, in bits (0 <= JS <= 1); 0·log 0 = 0."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        on = a > 0
        return float((a[on] * np.log2(a[on] / m[on])).sum())
    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def noniid_degree(counts: Sequence[float] | np.ndarray, global_counts: Sequence[float] | np.ndarray) -> float:
    """D(P) = JS(P ‖ P_G): how far the label distribution of ``counts`` is from the clients' overall one."""
    return js_divergence(label_distribution(counts), label_distribution(global_counts))


def server_share(acc: float, n0: int, d_round: float, n_round: int, d_server: float, decay: float, t: int
                 ) -> float:
    """α_t = (1 - acc_t) · n0·D(P'_t) / (n0·D(P'_t) + n'_t·D(P_0)) · decay^t.

    Args:
        acc: acc_t, the accuracy of x̄_t on D0.
        n0: |D0|.
        d_round: D(P'_t), the non-IID degree of the round's clients' pooled data.
        n_round: n'_t, the round's clients' samples.
        d_server: D(P_0), D0's non-IID degree.
        decay: the per-round decay (0, 1].
        t: the round, 0-based.
    0 when the round's clients are IID (D(P'_t) = 0): nothing for D0 to correct.
    """
    num = n0 * d_round
    if num <= 0:
        return 0.0
    return (1.0 - acc) * num / (num + n_round * d_server) * decay ** t


def effective_steps(alpha: float, mean_client_steps: float) -> float:
    """τ_eff = α_t · τ̄_t: the server's effective number of steps (τ̄_t: the clients' mean K_i)."""
    return alpha * mean_client_steps


def line10_gamma(gamma: float, tau_eff: float, k0: int) -> float:
    """γ_t = γ · min(1, τ_eff / K0): line 10's K0 steps of γ_t·η0 travel about τ_eff steps of γ·η0."""
    return gamma * min(1.0, tau_eff / k0) if k0 > 0 else 0.0


@dataclass(frozen=True)
class FedDU(FedAvg):
    """FedAvg whose line 10 takes a step γ_t·η0 set each round by FedDU's rule (module docstring).

    Attributes: global_lr: η_g; feddu_decay: decay, the per-round decay of the server's share α_t.
    """

    feddu_decay: float  # the spec's default, DECAY
    name: str = field(default="feddu", init=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.feddu_decay, (int, float)) and 0 < self.feddu_decay <= 1):
            raise ValueError(f"algorithm.feddu_decay = {self.feddu_decay!r}: expected a number in (0, 1] "
                             "(1 = no decay)")

    def server_gamma(self, gamma: float, x_bar: Params, results: ClientResults | None, t: int, sl: ServerLearning,
                     n0: int, counts: LabelCounts, d0_accuracy: Callable[[Params], float]) -> float:
        """γ_t for line 10 from round t's clients (``results``: ids, n_i, K_i) and x̄_t; ``gamma`` is the
        schedule's γ_t (default the constant γ). No client update: 0. The rules' ``server_gamma`` hook
        (``base.LocalSGD``), which the server's round calls (``server_round``)."""
        if results is None:
            return 0.0
        if len(results.ids) != len(results.sizes):
            raise ValueError("FedDU reads the label counts of the round's clients: ClientResults.ids must name them")
        overall = counts.overall
        d_round = noniid_degree(counts.pooled(results.ids), overall)
        d_server = noniid_degree(counts.server, overall)
        acc = d0_accuracy(x_bar) if n0 * d_round > 0 else 0.0  # acc_t only matters when α_t can be > 0
        alpha = server_share(acc, n0, d_round, sum(results.sizes), d_server, self.feddu_decay, t)
        tau_eff = effective_steps(alpha, sum(results.steps) / len(results.steps))
        return line10_gamma(gamma, tau_eff, server_steps(sl, n0))


@dataclass(frozen=True)
class D0Only(FedAvg):
    """The "D0 only" control: clients' updates are dropped (x̄_t = x_t), then FSL's line 10 on D0."""

    name: str = field(default="d0_only", init=False)

    def server_update(self, x: Params, state: State, finals: Params, weights: torch.Tensor,
                      ctx: RoundContext) -> tuple[Params, State]:
        return x, state


SPECS = (
    Spec("feddu", FedDU, (DECAY_PARAM,),
         server_learning="incremental", needs_server_data=True, title="FedDU", server_lr="local_lr",
         sets_gamma=True, reads_label_counts=True,
         summary="FedDU (FedDUAP): FedAvg, then K0 steps on D0 of γ_t·η0, γ_t from non-IID degrees and accuracy"),
    Spec("d0_only", D0Only, server_learning="incremental", needs_server_data=True, comm_factor=0,
         global_lr_search=None,  # the clients' updates are dropped: η_g changes nothing
         summary="control: D0 only, the clients' updates dropped, FSL's server steps on D0"),
)
