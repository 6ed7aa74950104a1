"""The server side of secure aggregation: fedsl's server half on the aggregate that Flower's SecAgg+ unmasks.

FSL needs only the aggregate of the clients' models: x̄_t = x_t + η_g·(Σ_i w_i x_i - x_t) (Algorithm 1, lines 8-9,
Mai et al., "Federated Learning with Server Learning", the paper's Algorithm 1), then line 10's K0 SGD steps of
γ·η0 on D0 from x̄_t. Under SecAgg+ (Bell et al., CCS 2020, after Bonawitz et al., CCS 2017) the server learns the
sum of the round's models and never one x_i; server learning runs on the server's own D0, unchanged.

Flower 1.42 has SecAgg+ in its legacy API only: ``SecAggPlusWorkflow.__call__``
(``flwr/server/workflow/secure_aggregation/secaggplus_workflow.py``) raises ``TypeError`` unless its context is a
``LegacyContext`` holding a legacy ``flwr.server.strategy.Strategy``; after unmasking it sets every FitRes's
parameters to the aggregate Σ_i q_i·x_i / Σ_i q_i (q_i: the reported weight w_i quantised) and calls the strategy's
``aggregate_fit``; ``flwr.serverapp`` has no SecAgg+ path. Hence:

- ``SecAggStrategy``: a legacy ``Strategy`` around ``FedslStrategy`` (the message-API strategy), whose node
  sampling, train config, server update, evaluation, records and checkpoints it reuses. ``configure_fit`` sends x_t
  and the train config to S of the connected nodes (``rng.sample_nodes``, as an open federation does);
  ``aggregate_fit`` checks the scalars the replies carry in clear and gives the algorithm's server half
  (``server_round.server_update``) every client's row as the aggregate, with the client's own n_i and K_i: a rule
  that reads the x_i only through their w-weighted mean gets what it would get from the x_i themselves
  (Σ_i w_i·agg = agg; FedDyn's Σ_i (x_i - x)/N = S·(agg - x)/N). The rules for which that does not hold are refused
  by ``config.check_secagg``.
- ``run_secagg``: Flower's ``DefaultWorkflow`` with ``SecAggPlusWorkflow`` as its fit workflow, wrapped so that a
  round the protocol halts (fewer than 2 nodes, too many dropouts to unmask) still runs server learning.

A reply that fails its checks cannot be taken out of the sum: that round applies no client update (x̄ = x_t, then
server learning), with one log line naming the node.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid
from flwr.supercore import log

from fedsl.core import rng
from fedsl.core.types import Params
from fedsl.flower.config import FlowerOptions, FlowerSetup
from fedsl.flower.grid import RoundGrid
from fedsl.flower.replies import BadReply, check_open_metrics
from fedsl.flower.secagg_client import SECAGG_CONFIG
from fedsl.flower.strategy import FedslStrategy, mean_reported


def secagg_weight_bound(options: FlowerOptions, weighted: bool) -> float:
    """Flower's ``max_weight``: the largest w_i, n_i ≤ ``max-examples`` (weighted) or 1 (the plain mean)."""
    return float(options.max_examples) if weighted else 1.0


def quantised_weight(weight: int, max_weight: float, quantization_range: int) -> int:
    """q_i = round(w_i / max_weight · Q): the integer weight SecAgg+ sums (``secaggplus_mod``'s stage 2)."""
    return round(weight / max_weight * quantization_range)


def aggregate_error_bound(weights: list[int], max_weight: float, clipping_range: float,
                          quantization_range: int) -> float:
    """The largest |agg - Σ q_i·clip(x_i)/Σ q_i| per entry: each client's stochastic rounding is off by under one step
    of 2c/Q on q_i/Q·x_i, so the sum of S is off by under S·2c/Q, and the mean by S·2c/Σ q_i (2c/Q for w_i = 1)."""
    total = sum(quantised_weight(w, max_weight, quantization_range) for w in weights)
    return 2.0 * clipping_range * len(weights) / total if total else math.inf


class SecAggStrategy(Strategy):
    """A legacy Flower strategy running fedsl's round on the aggregate that SecAgg+ unmasks.

    Args:
        core: the message-API strategy whose state, sampling, server update, evaluation and records are used.
    """

    def __init__(self, core: FedslStrategy) -> None:
        self.core = core
        self.names = core.sim.fm.names
        self._pending: dict[str, Any] | None = None
        self._started = False

    def __repr__(self) -> str:
        return f"SecAggStrategy({self.core.alg.name})"

    @property
    def weighted(self) -> bool:
        return bool(self.core.alg.weighted)

    def parameters(self) -> Parameters:
        """x_t (after server learning) as legacy Parameters: the arrays in the model's parameter order."""
        x = self.core.state.x
        return ndarrays_to_parameters([np.ascontiguousarray(x[n].detach().cpu().numpy()) for n in self.names])

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.parameters()

    def _wait(self, client_manager: ClientManager, first: bool) -> None:
        """As FedslStrategy's nodes: round 1 waits up to node-wait for min-nodes; a later round waits only when it
        has lost every node; none at all then fails the run (``no_nodes``; min-nodes = 0 goes on)."""
        options = self.core.setup.options
        need = options.min_nodes if first else min(options.min_nodes, 1)
        deadline = time.monotonic() + options.node_wait
        while len(self._usable(client_manager)) < need and time.monotonic() < deadline:
            log(INFO, "fedsl: waiting for nodes: %d connected (minimum %d)", len(self._usable(client_manager)), need)
            time.sleep(1.0)
        if not self._usable(client_manager):
            self.core.no_nodes("connected")

    def _usable(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """The connected nodes not dropped from the run, by node id."""
        return {p.node_id: p for p in client_manager.all().values() if p.node_id not in self.core.dropped}

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        """x_t and the round's train config to S of the connected nodes (seeded), with SecAgg+'s weighting."""
        core, cfg = self.core, self.core.setup.cfg
        t = core.offset + server_round - 1
        first, self._started = not self._started, True
        self._wait(client_manager, first)
        proxies = self._usable(client_manager)
        sampled = rng.sample_nodes(cfg.seed, t, list(proxies), cfg.algorithm.clients_per_round)
        log(INFO, "fedsl round %d: nodes %s sampled of %d connected (secure aggregation)", t + 1, sampled,
            len(proxies))
        self._pending = {"t": t, "sampled": sampled, "started": time.time()}
        # an open federation's train config names no partition (the node trains what it owns)
        config = {**core.train_config(t, 0), "secagg-weighted": self.weighted,
                  "secagg-clipping-range": float(core.setup.options.secagg_clipping_range)}
        fitins = FitIns(self.parameters(), cast(dict[str, Scalar], config))
        return [(proxies[n], fitins) for n in sampled]

    def check_fitres(self, fitres: FitRes, t: int) -> tuple[int, int, float | None, int]:
        """What a reply says in clear (n_i, K_i, loss, entries clipped), checked; its x_i is in the masked sum.

        Raises:
            BadReply: one line saying what is wrong.
        """
        options = self.core.setup.options
        # a stock Flower client (a NumPyClient) reports n_i as its FitRes's num_examples only
        metrics = {"num-examples": fitres.num_examples, **(fitres.metrics or {})}
        n_i, k_i, loss = check_open_metrics(metrics, t, options.max_examples)
        weight = n_i if self.weighted else 1
        if fitres.num_examples != weight:
            why = ("its num-examples, algorithm.weighted" if self.weighted else "the plain mean; a stock Flower "
                   "client weighs by its n_i: set algorithm.weighted = true for it")
            raise BadReply(f"SecAgg+ weight num_examples = {fitres.num_examples!r}: expected {weight} ({why})")
        clipped = metrics.get("secagg-clipped", 0)
        if type(clipped) is not int or clipped < 0:
            raise BadReply(f"metric secagg-clipped = {clipped!r}: expected an integer >= 0")
        return n_i, self.core.open_steps(n_i, k_i), loss, clipped

    def read_aggregate(self, parameters: Parameters) -> Params:
        """The unmasked aggregate as the model's parameters (its dtype and device), after checking it.

        Raises:
            BadReply: not the model's arrays, or not finite.
        """
        x = self.core.state.x
        arrays = parameters_to_ndarrays(parameters)
        if len(arrays) != len(self.names):
            raise BadReply(f"the aggregate has {len(arrays)} arrays: expected the model's {len(self.names)}")
        out = {}
        for name, array in zip(self.names, arrays):
            if list(array.shape) != list(x[name].shape):
                raise BadReply(f"the aggregate's {name} has shape {list(array.shape)}: expected {list(x[name].shape)}")
            if not np.isfinite(array).all():
                raise BadReply(f"the aggregate's {name} is not finite")
            out[name] = torch.from_numpy(np.array(array, copy=True)).to(device=x[name].device, dtype=x[name].dtype)
        return out

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]
                      ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """x_{t+1}: the rule's server update with every client's row = the aggregate, then server learning on D0."""
        core = self.core
        pending = self._take_pending(server_round)
        t = pending["t"]
        rows: dict[int, tuple[int, int, float | None, int]] = {}
        rejected: list[dict[str, Any]] = []
        for proxy, fitres in results:
            try:
                rows[proxy.node_id] = self.check_fitres(fitres, t)
            except BadReply as e:
                log(WARNING, "fedsl round %d: the reply of node %d is unusable: %s", t + 1, proxy.node_id, e)
                rejected.append({"node": proxy.node_id, "partition": None, "reason": str(e)})
        agg = None
        if results:
            try:
                agg = self.read_aggregate(results[0][1].parameters)  # SecAgg+ gave every FitRes the aggregate
            except BadReply as e:
                log(WARNING, "fedsl round %d: %s", t + 1, e)
                rejected.append({"node": None, "partition": None, "reason": str(e)})
        if rejected and rows:
            log(WARNING, "fedsl round %d: the masked sum includes every reply and cannot be taken apart: no client "
                "update applied (x̄ = x_t), then server learning", t + 1)
        ids = sorted(rows) if agg is not None and not rejected else []
        finals = {n: (agg, rows[n][0], rows[n][1]) for n in ids}
        core.state, m, applied = core.run_server_half(t, ids, finals)
        ids = ids if applied else []
        replied = {proxy.node_id for proxy, _ in results}
        lost = [n for n in pending["sampled"] if n not in replied]
        for node in lost:  # failed, or out of time, in one of the protocol's stages: SecAgg+ removed its masks
            core.dropped.add(node)
            log(WARNING, "fedsl round %d: no masked update from node %d (it failed or dropped out of SecAgg+)", t + 1,
                node)
        options = core.setup.options
        weights = [n_i if self.weighted else 1 for n_i, *_ in rows.values()]
        clipped = sum(r[3] for r in rows.values())
        if clipped:
            log(WARNING, "fedsl round %d: %d model entries were outside ±%g and SecAgg+ clipped them: raise "
                "secagg-clipping-range", t + 1, clipped, options.secagg_clipping_range)
        secagg = {"replies": len(results), "failures": len(failures), "weights": "num-examples" if self.weighted
                  else "uniform", "clipped": clipped,
                  "error_bound": aggregate_error_bound(weights, secagg_weight_bound(options, self.weighted),
                                                       options.secagg_clipping_range,
                                                       options.secagg_quantization_range) if weights else None}
        if ids:
            log(INFO, "fedsl round %d: the SecAgg+ aggregate of %d clients (within %.3g of their %s mean per entry), "
                "then %d server steps", t + 1, len(ids), secagg["error_bound"], secagg["weights"], m.server_steps)
        self._record(t, pending, ids, [rows[i][1] for i in ids], mean_reported([rows[i][2] for i in ids]), lost,
                     rejected, m, secagg)
        metrics: dict[str, Scalar] = {"clients": len(ids), "server-steps": m.server_steps}
        return self.parameters(), metrics

    def halted_round(self, server_round: int) -> None:
        """A round SecAgg+ halted before ``aggregate_fit`` (fewer than 2 sampled nodes, or too few left to unmask):
        no client update (x̄ = x_t), then server learning, as any round without a usable reply."""
        pending = self._take_pending(server_round)
        t = pending["t"]
        log(WARNING, "fedsl round %d: secure aggregation halted (fewer than 2 nodes, or too few left to unmask: see "
            "Flower's log above): no client update, then server learning", t + 1)
        self.core.state, m, _ = self.core.run_server_half(t, [], {})
        self._record(t, pending, [], [], None, [], [], m, {"halted": True})

    @property
    def awaited_round(self) -> int | None:
        """t of the round whose replies are awaited (sent by ``configure_fit``, not yet aggregated), else None."""
        return self._pending["t"] if self._pending else None

    def _take_pending(self, server_round: int) -> dict[str, Any]:
        pending = self._pending or {"t": self.core.offset + server_round - 1, "sampled": [], "started": time.time()}
        self._pending = None
        return pending

    def _record(self, t: int, pending: dict[str, Any], ids: list[int], steps: list[int], loss: float | None,
                lost: list[int], rejected: list[dict[str, Any]], m: Any, secagg: dict[str, Any]) -> None:
        self.core.record_round({
            "round": t + 1, "t": t, "sampled": pending["sampled"], "missing": [], "trained": ids,
            "lost_partitions": lost, "rejected": rejected, "client_steps": steps, "train_loss": loss,
            "server_steps": m.server_steps, "gamma": m.gamma, "cos_theta": m.cos_theta,
            "seconds": round(time.time() - pending["started"], 3), "secagg": secagg})

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []  # the server evaluates on its own test set (``evaluate``)

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
                           ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Central evaluation of x_t on the server's test set (the rounds ``cfg.evaluates``)."""
        out = self.core.evaluate(server_round, ArrayRecord())
        if out is None:
            return None
        return float(out["loss"]), {"accuracy": float(out["accuracy"])}


class SecAggFit:
    """Flower's ``SecAggPlusWorkflow`` as the fit workflow, plus fedsl's round when the protocol halts.

    SecAgg+ returns without calling ``aggregate_fit`` when it cannot aggregate; FSL's round still runs server
    learning, so this wrapper runs the strategy's ``halted_round`` then and stores its x_{t+1}.
    """

    def __init__(self, strategy: SecAggStrategy, workflow: SecAggPlusWorkflow) -> None:
        self.strategy, self.workflow = strategy, workflow

    def __call__(self, grid: Grid, context: Context) -> None:
        done = len(self.strategy.core.history)
        self.workflow(grid, context)
        if len(self.strategy.core.history) == done:
            server_round = cast(int, context.state.config_records[MAIN_CONFIGS_RECORD][WorkflowKey.CURRENT_ROUND])
            self.strategy.halted_round(server_round)
            context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
                self.strategy.parameters(), keep_input=True)


class AuditGrid(RoundGrid):
    """``RoundGrid`` that records every reply's content in the strategy's ``received`` (``received.json``), with
    the SecAgg+ stage it answers: what the server got from the clients."""

    def __init__(self, grid: Grid, strategy: SecAggStrategy, straggler: float | None = None) -> None:
        super().__init__(grid, straggler=straggler)
        self.strategy = strategy

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        stages = {m.content.config_records[SECAGG_CONFIG].get("stage") for m in messages
                  if SECAGG_CONFIG in m.content.config_records}
        replies = super().send_and_receive(messages, timeout=timeout)
        t = self.strategy.awaited_round
        kind = "train:" + "/".join(sorted(str(s) for s in stages)) if stages else "message"
        for msg in replies:
            self.strategy.core.record_reply(kind, msg, t)
        return replies


def _no_federated_evaluation(grid: Grid, context: Context) -> None:
    """The server evaluates on its own test set; the clients are sent no evaluate message."""


def run_secagg(grid: Grid, context: Context, setup: FlowerSetup) -> FedslStrategy:
    """The configured run under SecAgg+ (run config ``secagg = true``); returns the message-API strategy whose state,
    history and records the rounds updated (its ``state.x`` is x_T)."""
    options, cfg = setup.options, setup.cfg
    core = FedslStrategy(setup)
    done = core.resume()
    strategy = SecAggStrategy(core)
    workflow = SecAggPlusWorkflow(num_shares=options.secagg_shares, reconstruction_threshold=options.secagg_threshold,
                                  max_weight=secagg_weight_bound(options, strategy.weighted),
                                  clipping_range=options.secagg_clipping_range,
                                  quantization_range=options.secagg_quantization_range, timeout=options.round_timeout)
    log(INFO, "fedsl: secure aggregation (Flower's SecAgg+): shares %s, threshold %s, clipping ±%g, %d levels; the "
        "server gets only the %s mean of each round's models", options.secagg_shares, options.secagg_threshold,
        options.secagg_clipping_range, options.secagg_quantization_range,
        "num-examples-weighted" if strategy.weighted else "plain")
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=cfg.rounds - done), strategy=strategy)
    flow = DefaultWorkflow(fit_workflow=SecAggFit(strategy, workflow), evaluate_workflow=_no_federated_evaluation)
    flow(AuditGrid(grid, strategy, straggler=options.straggler_timeout or None), legacy)
    return core
