"""Stacked runs: several independent runs of one algorithm advance in lock-step.

A sweep's runs (seeds, γ, η_l, partitions, ...) of the same model and algorithm share
everything but numbers. ``StackedSimulator`` runs round t of all of them with *one*
executor call for all their clients (R runs × S clients become R·S rows of one vmapped
step of the algorithm's client half, each row with its own start x_t, step size η_l,
server state and client state), one for all their servers' K0 steps (line 10) and, when
the runs share the rule's numbers, one vmapped call of the rule's server update (lines 8-9);
sampling, batch plans (made on the host, copied once, and made a round ahead by the runner
while the device evaluates: ``prepare``), γ and the tables' rows stay per run. Clients made on demand (a
generated benchmark) are made per run each round, and runs of one seed share them (a tuning study's trials).
Results equal running the runs one by one (tested): every run keeps its own seed streams,
its own state and its own clients' tables.

What a GPU gains: a Scenario-2 round is 5 steps of 10 clients × 10 samples, far too
little work to fill the device; 60 stacked runs are 60 times the work per kernel launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.func import vmap

from fedsl.algorithms.base import LOCAL_SGD, RoundContext, client_weights
from fedsl.algorithms.server_round import server_updates
from fedsl.core.transfer import tensor_on, to_device
from fedsl.core.types import Params, State
from fedsl.engine.functional import evaluate_each, evaluate_many
from fedsl.engine.plan import BatchPlan, concat_plans
from fedsl.engine.simulator import ClientWork, RoundInfo, RunState, Simulator


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, or equal ones (shape, dtype, device and values)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))


def join_pools(pools: list[tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The runs' pools as one: equal pools once, different ones concatenated. Returns the joined (x, y), each
    run's offset into it, and each run's pool as the tensors kept (an equal pool: the first one's)."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    offsets, shared = [], []
    for x, y in pools:
        for j, (kx, ky) in enumerate(kept):
            if same_tensor(kx, x) and same_tensor(ky, y):
                offsets.append(sum(len(p[0]) for p in kept[:j]))
                shared.append((kx, ky))
                break
        else:
            offsets.append(sum(len(p[0]) for p in kept))
            kept.append((x, y))
            shared.append((x, y))
    if len(kept) == 1:
        return kept[0][0], kept[0][1], offsets, shared
    return torch.cat([p[0] for p in kept]), torch.cat([p[1] for p in kept]), offsets, shared


@dataclass
class HostWork:
    """A round's host work for every stacked run, with its device copies queued (``StackedSimulator.prepare``)."""

    t: int
    works: list[ClientWork]  # each run's sampled clients (ids on the device) and batch plan
    x: torch.Tensor  # the pool the plans index: the runs' pools (and clients made on demand this round), joined
    y: torch.Tensor
    plan: BatchPlan  # all runs' client plans, concatenated, on the device
    sl_runs: list[int]  # the runs with line 10 (incremental server learning)
    server_plan: BatchPlan | None  # their K0 batches, concatenated, on the device
    server_steps: list[int]  # K0 of each


EVAL_BATCH_GPU = 10_000  # images per forward when a GPU evaluates stacked models one at a time (measured)


class StackedSimulator:
    """R runs (one ``Simulator`` each) advanced together; see the module's docstring.

    The runs must share the model's architecture, device, dtype and the algorithm's kind
    (rule class, server-learning mode, data sharing) and the numbers of its local step (the spec's
    ``local_keys``, the clients' momentum and weight decay); anything else numeric may differ, and so
    may the data pools (identical pools are shared, different ones concatenated).
    """

    def __init__(self, sims: list[Simulator]) -> None:
        if not sims:
            raise ValueError("StackedSimulator needs at least one run, got an empty list")
        first = sims[0]
        shapes = {n: p.shape for n, p in first.fm.module.named_parameters()}
        for i, sim in enumerate(sims[1:], 1):
            why = self._incompatible(first, sim, shapes)
            if why:
                raise ValueError(f"run {i} cannot be stacked with run 0: {why}")
        self.sims = sims
        self.executor = first.executor
        # One pool for all runs: identical pools are shared (and de-duplicated in memory),
        # different ones concatenated, each run's indices shifted by its pool's offset.
        self.x, self.y, self.offsets, shared = join_pools([(sim.fed.x, sim.fed.y) for sim in sims])
        for sim, (x, y) in zip(sims, shared):
            sim.fed = replace(sim.fed, x=x, y=y)
        # clients made on demand (a generated benchmark) are in each round's pool, made by ``sample``
        self.on_demand = any(sim.fed.on_demand is not None for sim in sims)
        # Runs grouped by test set, for evaluation in one vmapped pass per group.
        self.test_groups: list[list[int]] = []
        for r, sim in enumerate(sims):
            for g in self.test_groups:
                s0 = sims[g[0]].fed
                if same_tensor(s0.x_test, sim.fed.x_test) and same_tensor(s0.y_test, sim.fed.y_test):
                    sim.fed = replace(sim.fed, x_test=s0.x_test, y_test=s0.y_test)
                    g.append(r)
                    break
            else:
                self.test_groups.append([r])
        self._nhwc_tests: dict[int, torch.Tensor] = {}  # test sets in channels-last layout, by group (GPU)
        self._ahead: HostWork | None = None  # a round's host work made ahead (``prepare``)
        # The rule's update (lines 8-9) of all runs in one vmapped call when they share the rule's numbers,
        # N and the weighting: per run it was R × dozens of small kernels, the host's largest share of a
        # stacked GPU round (benchmarks/RESULTS-gpu.md). ``server_updates`` takes it unless a run needs
        # more than the rule's update (FSL-p, cos θ_t). The sequential executor keeps the per-run path,
        # which is bit-identical to runs one by one.
        self.batched_server = first.executor.name == "vectorised" and all(
            sim.alg.rule == first.alg.rule and sim.alg.weighted == first.alg.weighted
            and sim.fed.num_clients == first.fed.num_clients for sim in sims)

    @staticmethod
    def _incompatible(a: Simulator, b: Simulator, shapes: dict) -> str:
        other = {n: p.shape for n, p in b.fm.module.named_parameters()}
        if other != shapes:
            return "the models' parameters differ in names or shapes"
        if (a.device, a.dtype) != (b.device, b.dtype):
            return f"device/dtype {b.device}/{b.dtype} differs from {a.device}/{a.dtype}"
        if type(a.executor) is not type(b.executor):
            return f"executor {b.executor.name!r} differs from {a.executor.name!r}"
        if type(a.alg.rule) is not type(b.alg.rule):
            return f"server rule {type(b.alg.rule).__name__} differs from {type(a.alg.rule).__name__}"
        local = {k for alg in (a.alg, b.alg) if alg.spec for k in alg.spec.local_keys}
        if any(getattr(a.alg.rule, k, None) != getattr(b.alg.rule, k, None) for k in sorted(local)):
            return (f"a hyper-parameter of the local step ({', '.join(sorted(local))}) differs; "
                    "one vmapped step takes one")
        optimiser = ("momentum", "weight_decay")  # the clients' μ_c and λ (LocalTraining): every rule's local step
        if any(getattr(a.alg.local, k) != getattr(b.alg.local, k) for k in optimiser):
            return ("the clients' momentum or weight decay (algorithm.client_momentum, algorithm.weight_decay) "
                    "differs; one vmapped step takes one")
        if a.alg.share_server_data != b.alg.share_server_data:
            return "one shares the server data with clients (DS) and the other does not"
        return ""

    def __len__(self) -> int:
        return len(self.sims)

    def initial_states(self, pretrain=None) -> list[RunState]:
        """x_0 and initial state of every run; ``pretrain`` is one ``Pretraining`` or one per run."""
        pre = pretrain if isinstance(pretrain, list) else [pretrain] * len(self.sims)
        return [sim.initial_state(p) for sim, p in zip(self.sims, pre)]

    def round(self, states: list[RunState], t: int) -> tuple[list[RunState], list[RoundInfo]]:
        """Round t of every run: ``[sim.round(s, t) for sim, s in zip(sims, states)]``, batched."""
        if len(states) != len(self.sims):
            raise ValueError(f"got {len(states)} states for {len(self.sims)} stacked runs")
        states = [replace(st, x=sim.layout(st.x)) for sim, st in zip(self.sims, states)]
        ahead, self._ahead = self._ahead, None
        host = ahead if ahead is not None and ahead.t == t else self._host_work(t)
        works, plan = host.works, host.plan
        works = [sim.measure_clients(w, st.x) for sim, w, st in zip(self.sims, works, states)]  # the rule's, at x_t
        sizes = [w.plan.num_clients for w in works]
        # the clients of all runs in one call: each starts from its run's x_t, with its run's η_l and
        # server state, and its own row of its run's tables (one rule: the runs share its local keys, μ_c and λ)
        starts = [st.x for st, s in zip(states, sizes) for _ in range(s)]
        lrs = [sim.alg.local.lr for sim, s in zip(self.sims, sizes) for _ in range(s)]
        sent = [inputs for sim, st, w in zip(self.sims, states, works) for inputs in sim.client_inputs(st, w)]
        mine = [sim.client_rows(st.clients, w) for sim, st, w in zip(self.sims, states, works)]
        rows = {k: {n: torch.cat([m[k][n] for m in mine]) for n in g} for k, g in mine[0].items()}
        if sum(sizes):
            finals, new_rows = self.executor.train(self.sims[0].alg.client, starts, plan, host.x, host.y, lrs, rows,
                                                   sent)
        else:  # no run has an available client this round (algorithm.availability < 1)
            finals, new_rows = {n: torch.empty(0) for n in states[0].x}, {k: {n: v for n, v in g.items()}
                                                                          for k, g in rows.items()}
        parts = {n: v.split(sizes) for n, v in finals.items()}  # each run's rows (views; one call per tensor)
        # each run's clients whose update arrives (all but dropped stragglers; None: none, x̄ = x_t)
        # each run's malicious clients' models attacked, as a run alone does (Simulator.results)
        results = [sim.results(w, {n: p[r] for n, p in parts.items()}, st.x, t) for r, (sim, w, st) in
                   enumerate(zip(self.sims, works, states))]
        rule_updates = None
        if self.batched_server and len(set(sizes)) == 1 and not any(w.dropped for w in works):
            def rule_updates():  # called only when every run's replies arrived (server_updates)
                received = finals  # what the servers receive: the clients' models, a malicious one's attacked
                if any(sim.attacked for sim in self.sims):
                    received = {n: torch.cat([res.params[n] for res in results]) for n in finals}
                return self._rule_updates(states, works, received, sizes[0])

        def line10(runs: list[int], x_bars: list[Params], _t: int, server_lrs: list[float]
                   ) -> list[tuple[Params, int]]:
            # the K0 steps of every run with line 10 in one executor call, on round t's batches planned ahead
            assert runs == host.sl_runs, f"line 10 for runs {runs}, planned for {host.sl_runs}"
            out = self.executor.train(LOCAL_SGD, x_bars, host.server_plan, host.x, host.y, server_lrs)[0]
            return [({n: v[j] for n, v in out.items()}, k0) for j, k0 in enumerate(host.server_steps)]
        # Algorithm 1's server half of every run (the same function a single run calls), batched
        ends = server_updates([sim.alg for sim in self.sims], states, results, t, [sim.server for sim in self.sims],
                              rule_updates, line10)
        out_states, infos, at = [], [], 0
        for sim, w, (new, metrics), s in zip(self.sims, works, ends, sizes):
            mine = {k: {n: v[at:at + s] for n, v in g.items()} for k, g in new_rows.items()}
            new, info = sim.end_round(new, w, mine, metrics)
            out_states.append(new)
            infos.append(info)
            at += s
        return out_states, infos

    def prepare(self, t: int) -> None:
        """Make round t's host work (sampling, every run's batch plans) now and queue its copies to the device;
        ``round(states, t)`` then takes it. The runner calls it for round t + 1 before it waits for round
        t's evaluation, so that on a GPU the host plans while the device computes, not while it idles.
        Everything it makes derives from (seed, t) alone: results are the same either way."""
        self._ahead = self._host_work(t)

    def _host_work(self, t: int) -> HostWork:
        """Round t's host work: every run's clients and batch plans, and the K0 batches of the runs with
        line 10; made on the host, then each concatenated and queued to the device in one copy (a copy
        per run would make the host wait for the GPU's queue each time: fedsl.core.transfer)."""
        first = self.sims[0]
        works = [sim.sample(t, host=True) for sim in self.sims]
        x, y, offsets = self.x, self.y, self.offsets
        if self.on_demand:  # this round's pools (D0, then the sampled clients' samples made now); equal ones once
            x, y, offsets, _ = join_pools([w.pool if w.pool is not None else (sim.fed.x, sim.fed.y)
                                           for sim, w in zip(self.sims, works)])
        plan = concat_plans([w.plan for w in works], offsets).to(first.device, first.dtype)
        ids = to_device(torch.cat([w.ids_t for w in works]), first.device).split([len(w.ids) for w in works])
        works = [replace(w, ids_t=i) for w, i in zip(works, ids)]
        servers = [sim.alg.server_learning for sim in self.sims]
        sl_runs = [r for r, server in enumerate(servers) if server is not None and server.incremental]
        if not sl_runs:
            return HostWork(t, works, x, y, plan, [], None, [])
        # D0 is at the start of each run's round pool too: the same offsets
        plans = [self.sims[r].server_plan(t, host=True) for r in sl_runs]
        server_plan = concat_plans(plans, [offsets[r] for r in sl_runs]).to(first.device, first.dtype)
        return HostWork(t, works, x, y, plan, sl_runs, server_plan, [p.steps[0] for p in plans])

    def _rule_updates(self, states: list[RunState], works: list, finals: Params, s: int
                      ) -> list[tuple[Params, State]]:
        """The rule's ``server_update`` of every run (lines 8-9) vmapped over the runs, each with its own
        x_t, server state, S clients' models, weights w_i, K_i and η_l (``batched_server``): each run's
        (x̄_t, new server state)."""
        first, r = self.sims[0], len(self.sims)
        device, rule, n_clients = first.device, first.alg.rule, first.fed.num_clients
        x = {n: torch.stack([st.x[n] for st in states]) for n in states[0].x}
        algo = {k: {n: torch.stack([st.algo[k][n] for st in states]) for n in g} for k, g in states[0].algo.items()}
        clients = {n: v.reshape(r, s, *v.shape[1:]) for n, v in finals.items()}
        weights = to_device(torch.stack([client_weights(w.sizes, first.alg.weighted) for w in works]), device)
        steps = tensor_on([w.steps for w in works], device)
        lrs = tensor_on([sim.alg.local.lr for sim in self.sims], device, torch.float64)

        def update(x, algo, finals, weights, steps, lr):
            return rule.server_update(x, algo, finals, weights, RoundContext(lr, steps, n_clients))
        x_bar, new_algo = vmap(update)(x, algo, clients, weights, steps, lrs)
        return [({n: v[j] for n, v in x_bar.items()}, {k: {n: v[j] for n, v in g.items()} for k, g in new_algo.items()})
                for j in range(r)]

    def evaluate(self, params: list[Params], runs: list[int] | None = None, clients: list | None = None
                 ) -> list[tuple[float, float]]:
        """(accuracy, loss) of each model on its run's test set; ``params[j]`` is run ``runs[j]``'s
        model (default: one model per run, in order); ``clients[j]``: its clients' states (what
        ``Simulator.evaluate`` reads for a model whose clients keep their BatchNorm, ``model.batchnorm = 'local'``).

        With the vectorised executor, the models sharing a test set are evaluated in one vmapped
        pass, except image models on a GPU: one after another in large channels-last batches,
        measured faster there; with the sequential one (CPU, where vmapped convolutions are slow),
        one after another. Either way the host waits for the device once per test set.
        """
        runs = list(range(len(self.sims))) if runs is None else runs
        if len(runs) != len(params):
            raise ValueError(f"got {len(params)} models for {len(runs)} runs")
        if self.executor.name != "vectorised" or self.sims[0].fm.norm_names:
            # BatchNorm's evaluation statistics depend on the batches they come from: each run's own evaluation
            clients = clients or [None] * len(params)
            return [self.sims[r].evaluate(p, c) for r, p, c in zip(runs, params, clients)]
        out: list[tuple[float, float]] = [(0.0, 0.0)] * len(params)
        for g, group in enumerate(self.test_groups):
            js = [j for j, r in enumerate(runs) if r in group]
            if not js:
                continue
            sim = self.sims[runs[js[0]]]
            if sim.device.type == "cuda" and sim.fed.x_test.dim() == 4:
                # one model at a time, large channels-last batches: faster than vmapped on a GPU
                # (benchmarks/RESULTS-gpu.md)
                if g not in self._nhwc_tests:
                    self._nhwc_tests[g] = sim.fed.x_test.contiguous(memory_format=torch.channels_last)
                models = [{n: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v
                           for n, v in params[j].items()} for j in js]
                res = evaluate_each(sim.fm, models, self._nhwc_tests[g], sim.fed.y_test,
                                    max(sim.eval_batch_size, EVAL_BATCH_GPU), sim.eval_precision)
                for j, r in zip(js, res):
                    out[j] = r
                continue
            stacked = {n: torch.stack([self.sims[runs[j]].layout(params[j])[n] for j in js]) for n in params[0]}
            # the models see a batch together: at least ~2,000 images per forward, since small per-model batches
            # left a GPU waiting (benchmarks/RESULTS-gpu.md, "The Fig. 5 heat map")
            batch = max(sim.eval_batch_size, 2000 // len(js))
            for j, res in zip(js, evaluate_many(sim.fm, stacked, sim.fed.x_test, sim.fed.y_test, batch,
                                                sim.eval_precision)):
                out[j] = res
        return out
