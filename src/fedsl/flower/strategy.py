"""The server side: fedsl's server update and server learning inside a Flower strategy.

``FedslStrategy`` subclasses Flower's message-API ``FedAvg`` and replaces two steps:

- ``configure_train``: the clients of round t are the simulator's,
  ``rng.sample_clients(seed, t, N, S)``; each is addressed through the node whose
  ``partition-id`` is that client id (learned with a ``query`` message when a node first
  shows up). A sampled client whose node is gone is skipped: the round goes on with the others.
- ``aggregate_train``: the replies' final models x_i, in client-id order as the simulator
  stacks them, go through the algorithm's own ``rule.update`` (FedAvg: x̄ = x + η_g·mean_i Δ_i,
  the plain mean of Algorithm 1 unless ``algorithm.weighted``; not Flower's weighting by
  example count), then server learning on D0 with the simulator's own step
  (Algorithm 1, line 10: K0 SGD steps with step size γ·η0 from x̄). The strategy's current
  model is the model *after* server learning, and that is what the next round sends out.

The server keeps only the server state (SCAFFOLD's c, FedDyn's h, optimiser moments, γ_t);
per-client tables stay on the clients. A rule's ``update`` reads the sampled clients' old rows
of those tables; the server gives it zero rows, which leaves the model and the server state
unchanged (FedDyn) or changes them by float rounding only (SCAFFOLD's c takes the difference
c_i⁺ − c_i, which does not depend on c_i), and discards the rows it returns: each client updates
its own row with the same rule (``fedsl.flower.client``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from fedsl.algorithms.base import State, zeros_like
from fedsl.engine import rng
from fedsl.engine.simulator import ClientWork, RunState
from fedsl.flower.config import FlowerSetup
from fedsl.flower.records import from_record, state_to_record, to_record

# Server-state entries a rule's clients need for their correction (SCAFFOLD: c - c_i).
# A rule may say so itself with a ``client_state`` attribute.
CLIENT_STATE = {"scaffold": ("c",)}


@dataclass(frozen=True)
class _Steps:
    """The part of a batch plan the server update reads: K_i of each client that replied."""

    steps: tuple[int, ...]


def describe_content(content: RecordDict) -> dict[str, Any]:
    """What a message carries: record names and kinds, array names with shape and dtype, scalars."""
    out: dict[str, Any] = {"records": {}, "arrays": {}, "metrics": {}, "configs": {}}
    for name, rec in content.items():
        out["records"][name] = type(rec).__name__
        if isinstance(rec, ArrayRecord):
            out["arrays"][name] = {k: {"shape": list(a.shape), "dtype": a.dtype} for k, a in rec.items()}
        elif isinstance(rec, MetricRecord):
            out["metrics"][name] = dict(rec)
        elif isinstance(rec, ConfigRecord):
            out["configs"][name] = {k: (v if not isinstance(v, bytes) else f"<{len(v)} bytes>") for k, v in rec.items()}
    return out


class FedslStrategy(FedAvg):
    """Flower FedAvg whose aggregation is fedsl's server update + server learning on D0.

    Args:
        setup: the config, federation (D0 and the test set are used), engine and algorithm.
        state: the starting RunState (default: x_0 from the model's initialisation, pretrained
            on D0 when ``server.pretrain``; the rule's server state; γ_0).
    Attributes:
        state: the current RunState; ``state.x`` is the global model after server learning.
        history: one dict per round (sampled, trained and replied clients, K0 taken, γ_t, ...).
        received: a description of every reply's content (what the server got from clients).
    """

    def __init__(self, setup: FlowerSetup, state: RunState | None = None) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_evaluate_nodes=0,
                         min_available_nodes=setup.options.min_nodes, weighted_by_key="num-examples")
        self.setup, self.sim, self.alg = setup, setup.sim, setup.algorithm
        rule = self.alg.rule
        if state is None:
            x = self.sim.initial_params(setup.pretrain)
            sl = self.alg.server_learning
            gamma = sl.gamma if sl is not None and sl.gamma_schedule.kind == "adaptive" else None
            state = RunState(x, self._server_part(rule.init_state(x, 0)), gamma)
        self.state = RunState(state.x, self._server_part(state.algo), state.gamma)
        self.tables = [k for k in rule.init_state(self.state.x, 0) if k.endswith("_i")]
        self.client_state = tuple(getattr(rule, "client_state", CLIENT_STATE.get(rule.name, ())))
        self.node_partition: dict[int, int] = {}  # node id -> partition id (client id i)
        self.dropped: set[int] = set()  # nodes that failed a round: not addressed again in this run
        self.history: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None

    def _params(self, record: ArrayRecord):
        """A model's parameters from a record (the model's names, the engine's device and dtype)."""
        return from_record(record, self.sim.device, self.sim.dtype, names=self.sim.fm.names)

    @staticmethod
    def _server_part(algo: State) -> State:
        return {k: v for k, v in algo.items() if not k.endswith("_i")}

    def summary(self) -> None:
        cfg = self.setup.cfg
        log(INFO, "\t├──> fedsl: %s on %s, N=%d, S=%d, %d rounds, seed %d", self.alg.name, cfg.data.dataset,
            self.setup.num_clients, cfg.algorithm.clients_per_round, cfg.rounds, cfg.seed)
        sl = self.alg.server_learning
        if sl is not None and sl.active:
            log(INFO, "\t└──> server learning (%s) on n0=%d: γ=%g, η0=%g, B0=%d", sl.mode, self.sim.fed.n0,
                sl.gamma, sl.lr, sl.batch_size)

    # ------------------------------------------------------------------ nodes

    def _query(self, grid: Grid, nodes: list[int]) -> None:
        """Learn the partition id of ``nodes`` (a ``query`` message each)."""
        msgs = [Message(RecordDict({"config": ConfigRecord({"want": "partition-id"})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=self.setup.options.round_timeout))
        answered = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            self._audit("query", msg)
            if msg.has_error():  # e.g. a missing or bad partition-id in the node's config
                log(WARNING, "fedsl: node %d left out of the run: %s", node, msg.error.reason)
                continue
            answered.add(node)
            pid = int(msg.content.config_records["partition"]["partition-id"])
            self.node_partition[node] = pid
        for n in nodes:
            if n not in answered:
                self.dropped.add(n)  # no (valid) answer: e.g. a bad partition-id in its node config

    def _refresh_nodes(self, grid: Grid, first: bool) -> None:
        deadline = time.monotonic() + (self.setup.options.node_wait if first else 0.0)
        while True:
            connected = set(grid.get_node_ids()) - self.dropped
            for gone in set(self.node_partition) - connected:
                del self.node_partition[gone]
            unknown = sorted(connected - set(self.node_partition))
            if unknown:
                self._query(grid, unknown)
            if len(self.node_partition) >= self.min_available_nodes or time.monotonic() >= deadline:
                return
            log(INFO, "fedsl: waiting for nodes: %d known (minimum %d)", len(self.node_partition),
                self.min_available_nodes)
            time.sleep(1.0)

    # ------------------------------------------------------------------ train

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send x_t (and the server state the clients need) to the nodes of the sampled clients."""
        t = server_round - 1
        first = not self.history and self._pending is None
        if first and len(arrays):  # x_0 as given to ``start`` (later rounds: our own x_{t}, after SL)
            self.state = RunState(self._params(arrays), self.state.algo, self.state.gamma)
        self._refresh_nodes(grid, first=first)
        cfg = self.setup.cfg
        ids = rng.sample_clients(cfg.seed, t, self.setup.num_clients, cfg.algorithm.clients_per_round)
        by_partition: dict[int, int] = {}
        for node, pid in sorted(self.node_partition.items()):
            if pid in by_partition:
                log(WARNING, "fedsl: nodes %d and %d both have partition-id %d; using %d", by_partition[pid],
                    node, pid, by_partition[pid])
                continue
            by_partition[pid] = node
        targets = {int(i): by_partition[int(i)] for i in ids if int(i) in by_partition}
        missing = [int(i) for i in ids if int(i) not in by_partition]
        log(INFO, "fedsl round %d: clients %s sampled, %d reachable%s", server_round, ids.tolist(), len(targets),
            f" (no node for {missing})" if missing else "")
        model = to_record(self.state.x)
        server_state = {k: self.state.algo[k] for k in self.client_state}
        messages = []
        for pid, node in targets.items():
            content = RecordDict({"arrays": model,
                                  "config": ConfigRecord({**dict(config), "server-round": server_round, "round": t,
                                                          "partition-id": pid})})
            if server_state:
                content["server-state"] = state_to_record(server_state)
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        self._pending = {"t": t, "sampled": ids.tolist(), "targets": targets, "missing": missing,
                         "started": time.time()}
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """x_{t+1}: the rule's server update on the clients' models, then server learning on D0."""
        pending = self._pending or {"t": server_round - 1, "sampled": [], "targets": {}, "missing": [],
                                    "started": time.time()}
        self._pending = None
        t, targets = pending["t"], pending["targets"]
        node_to_pid = {node: pid for pid, node in targets.items()}
        finals: dict[int, tuple[dict, int, int]] = {}  # pid -> (params, n_i, K_i)
        failed: dict[int, str] = {}
        for msg in replies:
            self._audit("train", msg, t)
            if msg.has_error():
                failed[msg.metadata.src_node_id] = msg.error.reason
                continue
            node = msg.metadata.src_node_id
            metrics = msg.content.metric_records["metrics"]
            pid = int(metrics["partition-id"])
            if node_to_pid.get(node) != pid or int(metrics["round"]) != t:
                log(WARNING, "fedsl: ignoring a reply from node %d (partition %s, round %s)", node, pid,
                    metrics["round"])
                continue
            params = self._params(msg.content.array_records["arrays"])
            finals[pid] = (params, int(metrics["num-examples"]), int(metrics["steps"]))
        lost = [node for pid, node in targets.items() if pid not in finals]
        for node in lost:  # no reply in time, or an error: leave it out for the rest of the run
            self.dropped.add(node)
            self.node_partition.pop(node, None)
            log(WARNING, "fedsl round %d: no update from node %d (partition %d): %s", server_round, node,
                node_to_pid[node], failed.get(node, "no reply within round-timeout"))
        ids = sorted(finals)
        new_state, server_steps, cos, gamma = self._server_update(t, ids, finals)
        self.state = new_state  # the cached current model is the model after server learning
        info = {"round": server_round, "t": t, "sampled": pending["sampled"], "missing": pending["missing"],
                "trained": ids, "lost_partitions": [node_to_pid[n] for n in lost],
                "client_steps": [finals[i][2] for i in ids], "server_steps": server_steps, "gamma": gamma,
                "cos_theta": cos, "seconds": round(time.time() - pending["started"], 3)}
        self.history.append(info)
        self._write()
        metrics = MetricRecord({"clients": len(ids), "server-steps": server_steps})
        return to_record(self.state.x), metrics

    def _server_update(self, t: int, ids: list[int], finals: dict) -> tuple[RunState, int, float | None, float | None]:
        """The server half of ``Simulator.round`` (its own ``aggregate``, ``server_sgd`` and ``end_round``)
        for the clients ``ids`` that replied."""
        sim = self.sim
        params = sim.layout(self.state.x)
        if not ids:
            log(WARNING, "fedsl round %d: no client update arrived; x̄ = x_t", t + 1)
            sl = self.alg.server_learning
            on = sl is not None and sl.active
            gamma = sl.gamma_schedule.value(t, self.state.gamma) if on else None
            new, server_steps = params, 0
            if on and sl.mode == "incremental":
                new, server_steps = sim.server_sgd(params, t, gamma)  # Algorithm 1, line 10
            return RunState(new, dict(self.state.algo), self.state.gamma), server_steps, None, gamma
        stacked = {n: torch.stack([finals[i][0][n] for i in ids]) for n in params}
        # the rule reads the sampled clients' old rows of its tables: zero rows (module docstring)
        rows = torch.arange(len(ids), device=sim.device)
        state = RunState(params, {**self.state.algo, **{k: zeros_like(params, (len(ids),)) for k in self.tables}},
                         self.state.gamma)
        work = ClientWork(params, np.asarray(ids), rows, [finals[i][1] for i in ids],
                          _Steps(tuple(finals[i][2] for i in ids)), None)
        agg = sim.aggregate(state, t, work, stacked)  # x̄ = rule update (FedAvg: x + η_g·mean Δ_i); FSL-p joins here
        new, server_steps = agg.new, agg.server_steps
        if agg.incremental:
            new, server_steps = sim.server_sgd(new, t, agg.gamma)  # Algorithm 1, line 10: K0 steps of γ·η0 on D0
        nxt, _ = sim.end_round(state, work, agg, new, server_steps)
        return RunState(nxt.x, self._server_part(nxt.algo), nxt.gamma), server_steps, agg.cos, agg.gamma

    # ------------------------------------------------------------------ evaluation and records

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Central evaluation of the current model on the server's test set (every ``eval_every`` rounds)."""
        cfg = self.setup.cfg
        if server_round % cfg.eval_every and server_round != cfg.rounds:
            return None
        acc, loss = self.sim.evaluate(self._params(arrays) if len(arrays) else self.state.x)
        self.evaluations.append({"round": server_round, "accuracy": acc, "loss": loss})
        self._write()
        return MetricRecord({"accuracy": acc, "loss": loss})

    def _audit(self, kind: str, msg: Message, t: int | None = None) -> None:
        entry: dict[str, Any] = {"kind": kind, "round": t, "node": msg.metadata.src_node_id}
        if msg.has_error():
            entry["error"] = msg.error.reason
        else:
            entry.update(describe_content(msg.content))
        self.received.append(entry)

    def _write(self, final: bool = False) -> None:
        out = self.setup.options.out_dir
        if not out:
            return
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "rounds.json").write_text(json.dumps(self.history, indent=1))
        (d / "received.json").write_text(json.dumps(self.received, indent=1, default=str))
        (d / "evaluations.json").write_text(json.dumps(self.evaluations, indent=1))
        if final:
            torch.save({"x": {n: p.detach().cpu().contiguous() for n, p in self.state.x.items()},
                        "algo": {k: {n: v.cpu() for n, v in g.items()} for k, g in self.state.algo.items()},
                        "gamma": self.state.gamma, "rounds": len(self.history)}, d / "final.pt")
            (d / "done.json").write_text(json.dumps({"status": "completed", "rounds": len(self.history)}))

    def finish(self) -> None:
        """Write the final model (``final.pt``) and ``done.json`` to ``out-dir``."""
        self._write(final=True)
