"""The server's round for any rule: its update, then server learning on D0 (Algorithm 1, lines 8-10).

Lines 8-9 are ``stages(alg)``: small functions over a ``Round``, each present or not by the algorithm's settings,
in one order (robust rule, private aggregate, weights, FSL-p's row, cos θ_t, the rule's update, the rule's γ_t).
The whole round:

    {x_i}   = robust_results(x_t, {x_i})                           a robust server rule, if any (robust.py)
    x̄_t     = rule.server_update(x_t, {x_i})                       lines 8-9 (FedAvg: x + η_g·mean Δ_i)
    x̄_t     ← distil {x_i} into x̄_t on unlabelled data U           FedDF, if the algorithm distils (distillation.py)
    x_{t+1} = LocalSGD(x̄_t, γ_t·η0, K0, D0)                        line 10 (FSL)

DP-FedAvg's private aggregate (``privacy``) replaces the clients' models after the robust step, when on (with
adaptive clipping, at the state's C_t, and the round's C_{t+1} goes to the next state).
FSL-p's server update joins the clients' beside the rule's mean instead of line 10, and γ_t comes from the
γ schedule, or from the rule itself when it has a ``server_gamma`` (FedDU); what each setting means:
``server_learning``.

``server_updates`` is that server half, written once, for R runs side by side: the simulator and the
Flower strategy call it for one run (``server_update``, a stack of one); ``StackedSimulator`` for all its
runs, passing its vmapped rule update and its one-call line 10.

It sits at the top of ``fedsl.algorithms`` (only the registry in ``__init__`` is above it): it runs an
``algorithm.Algorithm`` and imports the pieces that make one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from fedsl.algorithms.algorithm import Algorithm
from fedsl.algorithms.base import ClientResults, RoundContext, RunState, client_weights
from fedsl.algorithms.distillation import Distilled
from fedsl.algorithms.label_counts import LabelCounts
from fedsl.algorithms.privacy import next_clip, privatize
from fedsl.algorithms.robust import robust_results
from fedsl.algorithms.spec import SERVER_MEASURES
from fedsl.core.transfer import tensor_on, to_device
from fedsl.core.types import Params, State


@dataclass(frozen=True)
class ServerSide:
    """What the server has besides the clients' replies (the engine provides it).

    Attributes:
        num_clients: N.
        n0: |D0|, the server's data size (FSL-p's default weight w0).
        train: ``train(x, t, lr) -> (x', K0)``: LocalSGD on D0 with step ``lr`` over round t's
            K0 batches (the engine's batch plan; the same batches whatever the runtime).
        f0_grad: ∇f0(x), the full gradient of the server loss (the angle diagnostic, the measure ``server_grad``).
        d0_accuracy: the accuracy of a model on D0 (FedDU's acc_t).
        label_counts: the clients' and D0's class counts (FedDU's non-IID degrees), made when first read.
        root_update: ``root_update(x, t) -> x'``: FLTrust's server model, LocalSGD on D0 from x with the
            robust rule's own schedule (``Robust.root``) over round t's batches; None where no rule needs it.
        seed: the run's seed (the stream of DP-FedAvg's noise, with t: ``fedsl.algorithms.privacy``).
        distill: ``distill(x̄, finals, t) -> Distilled``: FedDF's distillation of round t's client models ``finals``
            (stacked) into x̄ on the server's unlabelled data (``distillation.distill`` over the engine's batches);
            None where the algorithm does not distil.
    """

    num_clients: int
    n0: int
    train: Callable[[Params, int, float], tuple[Params, int]]
    f0_grad: Callable[[Params], Params]
    d0_accuracy: Callable[[Params], float] | None = None
    label_counts: Callable[[], LabelCounts] | None = None
    root_update: Callable[[Params, int], Params] | None = None
    seed: int = 0
    distill: Callable[[Params, Params, int], Distilled] | None = None

    def measure(self, name: str, x: Params) -> Params:
        """A server measure at x (``spec.SERVER_MEASURES``) for a rule that declares it: ∇f0(x)."""
        if name == "server_grad":
            return self.f0_grad(x)
        raise ValueError(f"server measure {name!r}: expected one of {list(SERVER_MEASURES)}")


@dataclass
class Aggregated:
    """A server round after the rule's update, before line 10."""

    x_bar: Params  # x̄_t
    algo: State  # the rule's new server state
    gamma: float | None  # γ_t (None without server learning)
    cos: float | None  # cos θ_t, when measured
    server_steps: int  # K0 taken so far (FSL-p's server "client")
    incremental: bool  # whether line 10 is still to run
    clip: float | None = None  # C_{t+1} of DP's adaptive clipping (RunState.clip), else None
    distill_steps: int = 0  # FedDF's distillation steps taken this round


@dataclass(frozen=True)
class ServerMetrics:
    gamma: float | None  # γ_t used this round
    cos_theta: float | None  # cos θ_t between -∇f0(x_t) and the clients' update
    server_steps: int  # K0 taken (0 without server learning)
    distill_steps: int = 0  # FedDF's distillation steps taken (0 without distillation or client models)


def initial_gamma(alg: Algorithm) -> float | None:
    """γ_0 of a run's state (``RunState.gamma``): the adaptive schedule's running γ starts at γ; the other
    schedules keep none (their γ_t is a function of t alone)."""
    sl = alg.server_learning
    return sl.gamma if sl is not None and sl.gamma_schedule.kind == "adaptive" else None


@dataclass
class Round:
    """Round t on the server as far as the stages have taken it (``stages``)."""

    x: Params  # x_t
    algo: State  # the rule's server state: x_t's, then (after ``rule``) the new one
    results: ClientResults  # the replies, as the stages so far left them (robust rule, private aggregate)
    gamma: float | None  # γ_t (None without server learning)
    clip: float | None  # DP's clip: C_t's state, then C_{t+1}
    finals: Params | None = None  # the models the rule averages (``weigh``: the clients'; FSL-p adds its row)
    weights: torch.Tensor | None = None  # their weights
    cos: float | None = None  # cos θ_t, when measured
    server_steps: int = 0  # K0 taken so far (FSL-p's server "client")
    x_bar: Params | None = None  # x̄_t (``rule``)


Stage = Callable[[Algorithm, Round, int, "ServerSide"], Round]


def robust(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """A robust server rule replaces the clients' models (``robust_step``)."""
    r.results = robust_step(alg, r.x, r.results, t, server)
    return r


def private(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """DP-FedAvg: the private aggregate replaces the clients' models at C_t; adaptive clipping gives C_{t+1} from
    round t's noised count. What follows reads the private aggregate only."""
    c = alg.privacy.clip if r.clip is None else r.clip  # C_t
    if alg.privacy.adaptive is not None:
        r.clip = next_clip(r.x, r.results, alg.privacy, c, server.seed, t)
    r.results = privatize(r.x, r.results, alg.privacy, server.seed, t, c)
    return r


def weigh(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """The models the rule averages and their weights (plain 1/S, or n_i/Σn: ``client_weights``)."""
    device = next(iter(r.x.values())).device
    r.finals = r.results.params
    r.weights = to_device(client_weights(r.results.sizes, alg.weighted), device)  # queued, no GPU sync
    return r


def beside(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """FSL-p: the server trains from x_t like one more client; its model joins the mean with weight w0."""
    sl = alg.server_learning
    x0, r.server_steps = server.train(r.x, t, r.gamma * sl.lr)
    w0 = sl.parallel_weight(server.n0, r.results.sizes)
    r.finals = {n: torch.cat([r.finals[n], x0[n].unsqueeze(0)]) for n in r.finals}
    r.weights = torch.cat([(1.0 - w0) * r.weights, tensor_on([w0], r.weights.device, r.weights.dtype)])
    return r


def measure_angle(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """cos θ_t between -∇f0(x_t) and the clients' mean update (their rows, not FSL-p's)."""
    s = len(r.results.sizes)
    r.cos = angle(r.x, {n: v[:s] for n, v in r.finals.items()}, r.weights[:s] / r.weights[:s].sum(),
                  server.f0_grad(r.x))
    return r


def rule(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """Lines 8-9: the rule's server update (FedAvg: x̄ = x + η_g·Σ w_i Δ_i) and its new server state."""
    device = next(iter(r.x.values())).device
    steps = tensor_on(r.results.steps, device)
    extra = dict(r.results.extra)  # the clients' declared replies (q-FedAvg's F_i(x_t))
    for name in alg.spec.server_measures if alg.spec is not None else ():  # FedCLG-S's ∇f0(x_t)
        extra[name] = server.measure(name, r.x)
    r.x_bar, r.algo = alg.rule.server_update(r.x, r.algo, r.finals, r.weights,
                                             RoundContext(alg.local.lr, steps, server.num_clients, extra))
    return r


def rule_gamma(alg: Algorithm, r: Round, t: int, server: ServerSide) -> Round:
    """The rule's own γ_t for line 10, from x̄_t and the round's clients (FedDU)."""
    r.gamma = dynamic_gamma(alg, r.gamma, r.x_bar, r.results, t, server)
    return r


def stages(alg: Algorithm) -> tuple[Stage, ...]:
    """Lines 8-9 of ``alg``'s round as stages, in the order they run: a robust rule's models, DP's private
    aggregate, the weights, FSL-p's server row, cos θ_t, the rule's update, the rule's γ_t. The one place that
    says which concerns a round has and in what order; the server learning that follows (FedDF's distillation,
    line 10, γ's adaptation) runs over a stack of runs in ``server_updates``."""
    sl = alg.server_learning
    on = sl is not None and sl.active
    return tuple(stage for stage, present in (
        (robust, alg.robust is not None and alg.robust.active),
        (private, alg.privacy is not None),
        (weigh, True),
        (beside, on and sl.mode == "parallel"),
        (measure_angle, on and sl.measures_angle),
        (rule, True),
        (rule_gamma, on and dynamic(alg)),
    ) if present)


def initial_state(alg: Algorithm, x: Params, clients: State | None = None) -> RunState:
    """Round 0's state at x_0: the rule's initial server state, γ_0 (``initial_gamma``), the clients' tables
    ``clients`` (a deployment's server: none)."""
    return RunState(x, alg.rule.init_server_state(x), initial_gamma(alg), clients or {})


def aggregate(alg: Algorithm, state: RunState, results: ClientResults | None, t: int, server: ServerSide,
              updated: tuple[Params, State] | None = None) -> Aggregated:
    """Lines 8-9 of round t: γ_t, then the algorithm's ``stages``.

    ``results`` None: no client update reached the server this round; x̄ = x_t and the rule's state
    stays (a deployment's round whose replies were all lost or unusable). ``updated``: the rule's update
    (x̄_t, its new state) already computed by the engine (``RuleUpdates``; only when ``_rule_alone``).
    """
    sl = alg.server_learning
    on = sl is not None and sl.active
    gamma = sl.gamma_at(t, state.gamma) if on else None
    incremental = sl is not None and sl.incremental
    if results is None:
        if gamma is not None and dynamic(alg):
            gamma = dynamic_gamma(alg, gamma, state.x, None, t, server)
        return Aggregated(state.x, state.algo, gamma, None, 0, incremental, state.clip)
    if updated is not None:
        return Aggregated(*updated, gamma, None, 0, incremental, state.clip)
    r = Round(state.x, state.algo, results, gamma, state.clip)
    for stage in stages(alg):
        r = stage(alg, r, t, server)
    return Aggregated(r.x_bar, r.algo, r.gamma, r.cos, r.server_steps, incremental, r.clip)


def robust_step(alg: Algorithm, x: Params, results: ClientResults, t: int, server: ServerSide) -> ClientResults:
    """The algorithm's robust server rule on round t's replies (``robust.robust_results``: every model x_t + Δ̂),
    or the replies as they are without one. FLTrust's server update g0 is the engine's (``server.root_update``)."""
    rb = alg.robust
    if rb is None or not rb.active:
        return results
    root = None
    if rb.aggregator == "fltrust":
        if server.root_update is None:
            raise ValueError(f"robust.aggregator = 'fltrust' needs the server's update on D0: the engine of "
                             f"algorithm {alg.name!r} gives no root_update")
        root = server.root_update(x, t)
    return robust_results(x, results, rb, root, t)


def _rule_alone(alg: Algorithm) -> bool:
    """Whether lines 8-9 of ``alg``'s round are the rule's ``server_update`` alone (its ``stages`` are the weights
    and the rule) and read nothing but the models (no ``reply`` of the clients, no ``server_measures``: the engine's
    batched update passes neither). Only then may the engine's ``RuleUpdates`` stand in for them."""
    if alg.spec is not None and (alg.spec.reply or alg.spec.server_measures):
        return False
    return stages(alg) == (weigh, rule)


def dynamic(alg: Algorithm) -> bool:
    """Whether the rule sets line 10's γ_t from the round itself (its ``server_gamma`` hook, ``base.LocalSGD``;
    FedDU's: ``feddu.FedDU.server_gamma``)."""
    return alg.rule.server_gamma is not None


def dynamic_gamma(alg: Algorithm, gamma: float, x_bar: Params, results: ClientResults | None, t: int,
                  server: ServerSide) -> float:
    """The rule's γ_t for line 10 (FedDU), from the schedule's ``gamma``, x̄_t and the round's clients."""
    if server.d0_accuracy is None or server.label_counts is None:
        raise ValueError(f"algorithm {alg.name!r} needs the server's D0 accuracy and label counts from the engine")
    return alg.rule.server_gamma(gamma, x_bar, results, t, alg.server_learning, server.n0, server.label_counts(),
                                 server.d0_accuracy)


def finish(alg: Algorithm, state: RunState, agg: Aggregated, x_next: Params, server_steps: int
           ) -> tuple[RunState, ServerMetrics]:
    """The round's new state from x_{t+1} (after line 10, or x̄ without it) and γ's adaptation.

    The clients' tables (``state.clients``) are the engine's to update, with the rows the clients
    computed (``client_final``).
    """
    sl = alg.server_learning
    gamma = state.gamma
    if agg.gamma is not None and sl.gamma_schedule.kind == "adaptive" and agg.cos is not None:
        gamma = sl.gamma_schedule.adapt(sl.gamma, agg.gamma, agg.cos)
    new = replace(state, x=x_next, algo=agg.algo, gamma=gamma, clip=agg.clip)
    return new, ServerMetrics(agg.gamma, agg.cos, server_steps, agg.distill_steps)


RuleUpdates = Callable[[], list[tuple[Params, State]]]
"""The rule's update (lines 8-9 without FSL-p or cos θ_t) of every run of a stack in one call: each run's
(x̄_t, new server state). An engine offers it when the runs share the rule's numbers (one vmapped call)."""

Line10 = Callable[[list[int], list[Params], int, list[float]], list[tuple[Params, int]]]
"""Line 10 of several runs in one call: (the runs, their x̄_t, t, their step sizes γ_t·η0) -> each one's
(x_{t+1}, K0). An engine offers it to run the K0 server steps of all runs in one executor call."""


def server_update(alg: Algorithm, state: RunState, results: ClientResults | None, t: int,
                  server: ServerSide) -> tuple[RunState, ServerMetrics]:
    """The server's round t of one run: ``server_updates`` of a stack of one."""
    return server_updates([alg], [state], [results], t, [server])[0]


def server_updates(algs: Sequence[Algorithm], states: Sequence[RunState], results: Sequence[ClientResults | None],
                   t: int, servers: Sequence[ServerSide], rule_updates: RuleUpdates | None = None,
                   line10: Line10 | None = None) -> list[tuple[RunState, ServerMetrics]]:
    """Algorithm 1's server half, round t, for R runs side by side (a single run is a stack of one):
    each run's rule update (lines 8-9: FedAvg's x̄ = x + η_g·mean Δ_i; FSL-p beside it), then server
    learning on D0 from x̄ (line 10: K0 steps of γ_t·η0; FedDF distils x̄ first), then γ's adaptation.

    Args:
        algs: each run's algorithm.
        states: each run's state x_t.
        results: each run's clients' replies (None: none reached the server).
        t: the round.
        servers: each run's engine side (N, n0, LocalSGD on D0, ∇f0).
        rule_updates: the engine's rule update of all runs in one call, used when every run replied and
            every run's lines 8-9 are the rule's update alone (default: run by run).
        line10: the engine's line 10 of several runs in one call (default: run by run, ``server.train``).
    """
    if rule_updates is not None and all(r is not None for r in results) and all(_rule_alone(a) for a in algs):
        updated: Sequence[tuple[Params, State] | None] = rule_updates()
    else:
        updated = [None] * len(algs)
    aggs = [aggregate(alg, st, res, t, srv, up) for alg, st, res, srv, up in zip(algs, states, results, servers,
                                                                                updated)]
    for alg, a, res, srv in zip(algs, aggs, results, servers):
        if alg.distillation is not None and res is not None:  # FedDF: x̄_t distilled from the round's client models
            distil(alg, a, res, t, srv)
    nexts = [(a.x_bar, a.server_steps) for a in aggs]
    runs = [r for r, a in enumerate(aggs) if a.incremental]
    if runs:  # Algorithm 1, line 10: x_{t+1} = LocalSGD(x̄_t, γ_t·η0, K0, D0)
        lrs = [aggs[r].gamma * algs[r].server_learning.lr for r in runs]
        if line10 is None:
            outs = [servers[r].train(aggs[r].x_bar, t, lr) for r, lr in zip(runs, lrs)]
        else:
            outs = line10(runs, [aggs[r].x_bar for r in runs], t, lrs)
        for r, out in zip(runs, outs):
            nexts[r] = out
    return [finish(alg, st, a, x, k0) for alg, st, a, (x, k0) in zip(algs, states, aggs, nexts)]


def distil(alg: Algorithm, agg: Aggregated, results: ClientResults, t: int, server: ServerSide) -> None:
    """FedDF's fusion of round t (``distillation``): x̄_t, in ``agg``, replaced by the model distilled from the
    ensemble of the clients' models in ``results`` (those that reached the server) on the server's unlabelled data,
    before line 10. The clients' models as they arrived: the algorithm has no robust rule or privacy
    (``make_algorithm``), which would replace them."""
    if server.distill is None:
        raise ValueError(f"algorithm {alg.name!r} distils on the server's unlabelled data: the engine gives no distill")
    out = server.distill(agg.x_bar, results.params, t)
    agg.x_bar, agg.distill_steps = out.x, out.steps


def angle(x: Params, finals: Params, weights: torch.Tensor, g0: Params) -> float:
    """cos θ_t between -∇f0(x_t) (``g0`` = ∇f0(x_t)) and the clients' mean update Δ_t = Σ w_i (x_i - x_t).

    Δ_t stands in for -∇F(x_t), which the server cannot compute: the paper's descent condition
    needs ⟨∇F, ∇f0⟩ > 0. Both are taken at x_t, where the clients start; at x̄_t (after
    aggregation) we measured the sign flipped on the quickstart data even though the true
    cos(∇F, ∇f0) stayed near 0.9.
    """
    delta = {n: (weights.to(v.dtype).reshape(-1, *([1] * x[n].dim())) * (v - x[n])).sum(0) for n, v in finals.items()}
    dot = sum(-(g0[n] * delta[n]).sum() for n in x)
    norm = torch.sqrt(sum((g0[n] ** 2).sum() for n in x)) * torch.sqrt(sum((delta[n] ** 2).sum() for n in x))
    return float(dot / norm) if norm > 0 else math.nan
