"""The server side: fedsl's server update and server learning inside a Flower strategy.

``FedslStrategy`` subclasses Flower's message-API ``FedAvg`` and replaces two steps:

- ``configure_train``: the clients of round t are the simulator's,
  ``rng.sample_clients(seed, t, N, S)``; each is addressed through the node the server assigned
  that partition to (``node-partitions``, or the first connected node that claimed it in its
  reply to a ``query`` message; a node claiming a partition it was not assigned is left out).
  A sampled client whose node is gone is skipped: the round goes on with the others.
- ``aggregate_train``: every reply is checked first (``check_reply``: from a node sent a train
  message this round, for its partition and round, the model's array names, shapes and dtype,
  finite values, the metrics as integers, n_i the partition's size); a bad one is logged in one
  line and left out of the round. The usable replies' final models x_i, in client-id order as the simulator
  stacks them, go through the algorithm's own ``rule.update`` (FedAvg: x̄ = x + η_g·mean_i Δ_i,
  the plain mean of Algorithm 1 unless ``algorithm.weighted``; not Flower's weighting by
  example count), then server learning on D0 with the simulator's own step
  (Algorithm 1, line 10: K0 SGD steps with step size γ·η0 from x̄). The strategy's current
  model is the model *after* server learning, and that is what the next round sends out.
  A round without a usable reply (or whose aggregate is not finite) applies no client update:
  x̄ = x_t, then server learning as usual, and the round counts.
- every ``checkpoint_every`` rounds the model, the server state, γ_t and the records are saved
  atomically to ``out-dir/checkpoint.pt``; ``resume`` continues a ServerApp from it.

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
from fedsl.core import rng
from fedsl.engine.simulator import ClientWork, RunState
from fedsl.experiments.config import ConfigError
from fedsl.experiments.results import RunDir, atomic_write
from fedsl.flower.config import FlowerSetup
from fedsl.flower.records import from_record, state_to_record, to_record

# Server-state entries a rule's clients need for their correction (SCAFFOLD: c - c_i).
# A rule may say so itself with a ``client_state`` attribute.
CLIENT_STATE = {"scaffold": ("c",)}

# The metrics a train reply must carry, each an integer.
TRAIN_METRICS = ("num-examples", "steps", "partition-id", "round")
CHECKPOINT = "checkpoint.pt"
# Config keys a resumed run may change: they do not change the rounds' arithmetic.
RESUMABLE_CHANGES = ("rounds", "eval_every", "checkpoint_every", "threads")


class BadReply(ValueError):
    """A reply the server cannot use; ``impostor``: it claims a partition its node was not assigned."""

    def __init__(self, reason: str, impostor: bool = False) -> None:
        super().__init__(reason)
        self.impostor = impostor


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def check_reply(msg: Message, expected: dict[str, torch.Tensor], partition: int, t: int,
                examples: int | None = None) -> tuple[dict, int, int]:
    """A train reply's final model x_i, n_i and K_i, after checking everything in it the server uses.

    Args:
        msg: the reply (without an error).
        expected: the model's parameters (their names, shapes and dtype are what x_i must have).
        partition: the partition the server sent this node.
        t: the round (0-based).
        examples: n_i, the partition's size, when the server knows it.
    Returns:
        (x_i as numpy arrays by name, n_i, K_i).
    Raises:
        BadReply: one line saying what is wrong.
    """
    content = msg.content
    metrics = content.metric_records.get("metrics")
    if metrics is None:
        raise BadReply(f"no MetricRecord 'metrics' (records: {sorted(content.keys())})")
    missing = [k for k in TRAIN_METRICS if k not in metrics]
    if missing:
        raise BadReply(f"metric {', '.join(missing)} missing (has {sorted(metrics.keys())})")
    wrong = {k: metrics[k] for k in TRAIN_METRICS if type(metrics[k]) is not int}
    if wrong:
        raise BadReply(f"metric {', '.join(f'{k} = {v!r}' for k, v in wrong.items())}: expected an integer")
    if metrics["partition-id"] != partition:
        raise BadReply(f"claims partition-id {metrics['partition-id']}, but the server sent it partition {partition}",
                       impostor=True)
    if metrics["round"] != t:
        raise BadReply(f"round = {metrics['round']}: expected {t} (a stale or replayed reply)")
    for key in ("num-examples", "steps"):
        if metrics[key] < 1:
            raise BadReply(f"metric {key} = {metrics[key]}: expected >= 1")
    if examples is not None and metrics["num-examples"] != examples:
        raise BadReply(f"metric num-examples = {metrics['num-examples']}: partition {partition} has {examples} samples")
    arrays = content.array_records.get("arrays")
    if arrays is None:
        raise BadReply(f"no ArrayRecord 'arrays' (records: {sorted(content.keys())})")
    lacking, extra = sorted(set(expected) - set(arrays.keys())), sorted(set(arrays.keys()) - set(expected))
    if lacking or extra:
        raise BadReply("arrays do not match the model's parameters: "
                       + "; ".join(f"{what} {names[:3]}{' ...' if len(names) > 3 else ''}"
                                   for what, names in (("missing", lacking), ("unexpected", extra)) if names))
    out = {}
    for name, ref in expected.items():
        array = arrays[name]
        want_dtype, want_shape = np.dtype(str(ref.dtype).removeprefix("torch.")), list(ref.shape)
        try:
            value = array.numpy()
        except Exception as e:  # noqa: BLE001 - whatever the bytes are, the reply is unusable
            raise BadReply(f"array {name!r} cannot be read: {_one_line(e)}") from None
        # what the array says it is (Flower's metadata) and what its bytes hold
        for what, shape, dtype in (("declares", list(array.shape), str(array.dtype)),
                                   ("holds", list(value.shape), str(value.dtype))):
            if shape != want_shape:
                raise BadReply(f"array {name!r} {what} shape {shape}: expected {want_shape}")
            if dtype != str(want_dtype):
                raise BadReply(f"array {name!r} {what} dtype {dtype}: expected {want_dtype}")
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:
            raise BadReply(f"array {name!r} has {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf)")
        out[name] = value
    return out, metrics["num-examples"], metrics["steps"]


def _finite(params: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values())


def _config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two config dumps differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _config_diff(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


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
        offset: rounds done before this ServerApp started (a resumed run's checkpoint round).
        history: one dict per round (sampled, trained, lost and rejected clients, K0 taken, γ_t, ...).
        received: a description of every reply's content (what the server got from clients).
        node_partition: node id -> the partition the server assigned it (for connected nodes).
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
        self.assigned: dict[int, int] = dict(setup.options.node_partitions)  # node-partitions (empty: first claim)
        for node, pid in self.assigned.items():
            if not 0 <= pid < setup.num_clients:
                raise ConfigError(f"run config node-partitions {node}:{pid}: expected 0 <= partition id < "
                                  f"{setup.num_clients} (the federation's clients)")
        self.node_partition: dict[int, int] = {}  # node id -> partition id (client id i)
        self.dropped: set[int] = set()  # nodes left out of the rest of this run
        self.offset = 0
        self.history: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None
        self._started = False

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

    def _claim(self, msg: Message) -> int:
        """The partition id a node claims in its reply to the ``query`` message."""
        info = msg.content.config_records.get("partition")
        pid = None if info is None else info.get("partition-id")
        if type(pid) is not int or not 0 <= pid < self.setup.num_clients:
            raise BadReply(f"its query reply has partition-id = {pid!r}: expected an integer in "
                           f"0..{self.setup.num_clients - 1}")
        return pid

    def _assignment_error(self, node: int, pid: int) -> str | None:
        """Why ``node`` may not train partition ``pid`` (None: it may)."""
        if self.assigned:
            if node not in self.assigned:
                return f"it claims partition-id {pid} but is not in node-partitions"
            if self.assigned[node] != pid:
                return f"it claims partition-id {pid} but node-partitions assigns it partition {self.assigned[node]}"
            return None
        holder = next((n for n, p in self.node_partition.items() if p == pid), None)
        if holder is not None:
            return f"it claims partition-id {pid}, already assigned to node {holder}"
        return None

    def _query(self, grid: Grid, nodes: list[int]) -> None:
        """Learn the partition ``nodes`` claim (a ``query`` message each) and assign it, or leave them out."""
        msgs = [Message(RecordDict({"config": ConfigRecord({"want": "partition-id"})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=self.setup.options.round_timeout))
        answered = set()
        # lowest node id first: of two new nodes claiming one partition, the lower id gets it
        for msg in sorted(replies, key=lambda m: m.metadata.src_node_id):
            node = msg.metadata.src_node_id
            self._audit("query", msg)
            if node not in nodes or node in answered:
                log(WARNING, "fedsl: ignoring a query reply of node %d: it was not asked, or answered twice", node)
                continue
            answered.add(node)
            if msg.has_error():  # e.g. a missing or bad partition-id in the node's config
                log(WARNING, "fedsl: node %d left out of the run: %s", node, msg.error.reason)
                continue
            try:
                pid = self._claim(msg)
            except BadReply as e:
                log(WARNING, "fedsl: node %d left out of the run: %s", node, e)
                continue
            why = self._assignment_error(node, pid)
            if why is not None:
                log(WARNING, "fedsl: node %d left out of the run: %s", node, why)
                continue
            self.node_partition[node] = pid
        for n in nodes:
            if n not in self.node_partition:
                self.dropped.add(n)  # no (valid) answer, or a partition it was not assigned

    def _refresh_nodes(self, grid: Grid, first: bool) -> None:
        deadline = time.monotonic() + (self.setup.options.node_wait if first else 0.0)
        while True:
            connected = set(grid.get_node_ids()) - self.dropped
            for gone in set(self.node_partition) - connected:
                del self.node_partition[gone]  # its partition is free again (e.g. for the node restarted)
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
        t = self.offset + server_round - 1
        first, self._started = not self._started, True
        if first and len(arrays):  # x_0 as given to ``start`` (later rounds: our own x_{t}, after SL)
            self.state = RunState(self._params(arrays), self.state.algo, self.state.gamma)
        self._refresh_nodes(grid, first=first)
        cfg = self.setup.cfg
        ids = rng.sample_clients(cfg.seed, t, self.setup.num_clients, cfg.algorithm.clients_per_round)
        by_partition = {pid: node for node, pid in self.node_partition.items()}  # one node per partition
        targets = {int(i): by_partition[int(i)] for i in ids if int(i) in by_partition}
        missing = [int(i) for i in ids if int(i) not in by_partition]
        log(INFO, "fedsl round %d: clients %s sampled, %d reachable%s", t + 1, ids.tolist(), len(targets),
            f" (no node for {missing})" if missing else "")
        model = to_record(self.state.x)
        server_state = {k: self.state.algo[k] for k in self.client_state}
        messages = []
        for pid, node in targets.items():
            content = RecordDict({"arrays": model,
                                  "config": ConfigRecord({**dict(config), "server-round": t + 1, "round": t,
                                                          "partition-id": pid})})
            if server_state:
                content["server-state"] = state_to_record(server_state)
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        self._pending = {"t": t, "sampled": ids.tolist(), "targets": targets, "missing": missing,
                         "started": time.time()}
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """x_{t+1}: the rule's server update on the clients' usable models, then server learning on D0."""
        pending = self._pending or {"t": self.offset + server_round - 1, "sampled": [], "targets": {},
                                    "missing": [], "started": time.time()}
        self._pending = None
        t, targets = pending["t"], pending["targets"]
        node_to_pid = {node: pid for pid, node in targets.items()}
        finals: dict[int, tuple[dict, int, int]] = {}  # pid -> (params, n_i, K_i)
        failed: dict[int, str] = {}
        rejected: list[dict[str, Any]] = []
        impostors: set[int] = set()
        seen: set[int] = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            self._audit("train", msg, t)
            pid = node_to_pid.get(node)
            if pid is None or node in seen:
                why = "a second reply this round" if node in seen else "it was sent no train message this round"
                log(WARNING, "fedsl round %d: dropped a reply of node %d: %s", t + 1, node, why)
                rejected.append({"node": node, "partition": pid, "reason": why})
                continue
            seen.add(node)
            if msg.has_error():
                failed[node] = msg.error.reason
                continue
            try:
                # n_i weighs the update (algorithm.weighted, FSL-p): the federation, rebuilt from the
                # seed on every machine, says what it is
                arrays, n_i, k_i = check_reply(msg, self.state.x, pid, t, len(self.sim.client_data[pid]))
            except BadReply as e:
                log(WARNING, "fedsl round %d: dropped the reply of node %d (partition %d): %s", t + 1, node, pid, e)
                rejected.append({"node": node, "partition": pid, "reason": str(e)})
                if e.impostor:
                    impostors.add(node)
                continue
            params = {n: torch.from_numpy(np.array(arrays[n], copy=True)).to(device=self.sim.device,
                                                                             dtype=self.sim.dtype)
                      for n in self.sim.fm.names}
            finals[pid] = (params, n_i, k_i)
        # no reply in time, an error or another partition's reply: left out for the rest of the run
        # (a reply that was merely unusable leaves its node in the run: it gets x_{t+1} next time)
        bad_content = {r["node"] for r in rejected if r["partition"] is not None} - impostors
        lost = [node for pid, node in targets.items() if pid not in finals and node not in bad_content]
        for node in lost:
            self.dropped.add(node)
            self.node_partition.pop(node, None)
            if node not in impostors:
                log(WARNING, "fedsl round %d: no update from node %d (partition %d): %s", t + 1, node,
                    node_to_pid[node], failed.get(node, "no reply within round-timeout"))
        ids = sorted(finals)
        result = self._server_update(t, ids, finals) if ids else None
        if result is None:
            if targets:
                log(WARNING, "fedsl round %d: no usable client update (%d sent, %d replies dropped): x̄ = x_t, "
                    "then server learning", t + 1, len(targets), len(rejected))
            ids = []
            result = self._no_update(t)
        new_state, server_steps, cos, gamma = result
        self.state = new_state  # the cached current model is the model after server learning
        info = {"round": t + 1, "t": t, "sampled": pending["sampled"], "missing": pending["missing"],
                "trained": ids, "lost_partitions": [node_to_pid[n] for n in lost], "rejected": rejected,
                "client_steps": [finals[i][2] for i in ids], "server_steps": server_steps, "gamma": gamma,
                "cos_theta": cos, "seconds": round(time.time() - pending["started"], 3)}
        self.history.append(info)
        every = self.setup.cfg.checkpoint_every
        if every and ((t + 1) % every == 0 or t + 1 == self.setup.cfg.rounds):
            self.save_checkpoint()
        self._write()
        metrics = MetricRecord({"clients": len(ids), "server-steps": server_steps})
        return to_record(self.state.x), metrics

    def _no_update(self, t: int) -> tuple[RunState, int, None, float | None]:
        """Round t without a client update: x̄ = x_t, then server learning (incremental) as usual."""
        sl = self.alg.server_learning
        on = sl is not None and sl.active
        gamma = sl.gamma_schedule.value(t, self.state.gamma) if on else None
        new, server_steps = self.sim.layout(self.state.x), 0
        if on and sl.mode == "incremental":
            new, server_steps = self.sim.server_sgd(new, t, gamma)  # Algorithm 1, line 10
        return RunState(new, dict(self.state.algo), self.state.gamma), server_steps, None, gamma

    def _server_update(self, t: int, ids: list[int], finals: dict
                       ) -> tuple[RunState, int, float | None, float | None] | None:
        """The server half of ``Simulator.round`` (its own ``aggregate``, ``server_sgd`` and ``end_round``)
        for the clients ``ids`` that replied; None when the aggregate is not finite."""
        sim = self.sim
        params = sim.layout(self.state.x)
        stacked = {n: torch.stack([finals[i][0][n] for i in ids]) for n in params}
        # the rule reads the sampled clients' old rows of its tables: zero rows (module docstring)
        rows = torch.arange(len(ids), device=sim.device)
        state = RunState(params, {**self.state.algo, **{k: zeros_like(params, (len(ids),)) for k in self.tables}},
                         self.state.gamma)
        work = ClientWork(params, np.asarray(ids), rows, [finals[i][1] for i in ids],
                          _Steps(tuple(finals[i][2] for i in ids)), None)
        agg = sim.aggregate(state, t, work, stacked)  # x̄ = rule update (FedAvg: x + η_g·mean Δ_i); FSL-p joins here
        new, server_steps = agg.new, agg.server_steps
        if agg.incremental and _finite(new):
            new, server_steps = sim.server_sgd(new, t, agg.gamma)  # Algorithm 1, line 10: K0 steps of γ·η0 on D0
        nxt, _ = sim.end_round(state, work, agg, new, server_steps)
        server = self._server_part(nxt.algo)
        if not _finite(nxt.x) or not all(_finite(v) for v in server.values()):
            # finite replies whose aggregate (or server learning from it) overflows
            log(WARNING, "fedsl round %d: the update from clients %s is not finite (values too large): "
                "no client update applied", t + 1, ids)
            return None
        return RunState(nxt.x, server, nxt.gamma), server_steps, agg.cos, agg.gamma

    # ------------------------------------------------------------------ evaluation and records

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Central evaluation of the current model on the server's test set (every ``eval_every`` rounds)."""
        cfg = self.setup.cfg
        r = self.offset + server_round
        if r % cfg.eval_every and r != cfg.rounds or any(e["round"] == r for e in self.evaluations):
            return None
        acc, loss = self.sim.evaluate(self._params(arrays) if len(arrays) else self.state.x)
        self.evaluations.append({"round": r, "accuracy": acc, "loss": loss})
        self._write()
        return MetricRecord({"accuracy": acc, "loss": loss})

    def _audit(self, kind: str, msg: Message, t: int | None = None) -> None:
        entry: dict[str, Any] = {"kind": kind, "round": t, "node": msg.metadata.src_node_id}
        if msg.has_error():
            entry["error"] = msg.error.reason
        else:
            entry.update(describe_content(msg.content))
        self.received.append(entry)

    def _out(self) -> Path | None:
        out = self.setup.options.out_dir
        if not out:
            return None
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _write(self, final: bool = False) -> None:
        d = self._out()
        if d is None:
            return
        for name, data in (("rounds.json", self.history), ("received.json", self.received),
                           ("evaluations.json", self.evaluations)):
            text = json.dumps(data, indent=1, default=str)
            atomic_write(d / name, lambda p, text=text: p.write_text(text))
        if final:
            blob = {"x": {n: p.detach().cpu().contiguous() for n, p in self.state.x.items()},
                    "algo": {k: {n: v.cpu() for n, v in g.items()} for k, g in self.state.algo.items()},
                    "gamma": self.state.gamma, "rounds": len(self.history)}
            atomic_write(d / "final.pt", lambda p: torch.save(blob, p))
            atomic_write(d / "done.json", lambda p: p.write_text(json.dumps({"status": "completed",
                                                                               "rounds": len(self.history)})))

    def finish(self) -> None:
        """Write the final model (``final.pt``) and ``done.json`` to ``out-dir``."""
        self._write(final=True)

    # ------------------------------------------------------------------ checkpoint and resume

    def _config_dump(self) -> dict[str, Any]:
        return self.setup.cfg.model_dump(mode="json")

    def save_checkpoint(self) -> Path | None:
        """``out-dir/checkpoint.pt`` (written atomically): the model after round ``len(history)``, the
        server state, γ_t, the run's records so far and its config."""
        d = self._out()
        if d is None:
            return None
        blob = {"format": "fedsl-flower-checkpoint/1", "round": len(self.history),
                "x": {n: p.detach().cpu().contiguous() for n, p in self.state.x.items()},
                "algo": {k: {n: v.detach().cpu().contiguous() for n, v in g.items()}
                         for k, g in self.state.algo.items()},
                "gamma": self.state.gamma, "history": json.dumps(self.history, default=str),
                "evaluations": json.dumps(self.evaluations), "config": json.dumps(self._config_dump())}
        atomic_write(d / CHECKPOINT, lambda p: torch.save(blob, p))
        return d / CHECKPOINT

    def restore(self, blob: dict[str, Any]) -> None:
        """Continue from a checkpoint's round (``save_checkpoint``'s blob).

        Raises:
            ConfigError: the checkpoint is of another config (other than ``RESUMABLE_CHANGES``), or
                past ``rounds``.
        """
        cfg = self.setup.cfg
        ignore = set(RESUMABLE_CHANGES)
        theirs, ours = json.loads(blob["config"]), self._config_dump()
        diff = [k for k in _config_diff(theirs, ours) if k.split(".")[0] not in ignore]
        if diff:
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} is of another config (differs in "
                              f"{', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''}): use another out-dir, "
                              f"or resume = false to start over")
        done = int(blob["round"])
        if done > cfg.rounds:
            raise ConfigError(f"{self.setup.options.out_dir}/{CHECKPOINT} is at round {done}, past rounds = "
                              f"{cfg.rounds}")
        sim = self.sim

        def dev(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {n: v.to(device=sim.device, dtype=sim.dtype) for n, v in group.items()}

        self.state = RunState(dev(blob["x"]), {k: dev(g) for k, g in blob["algo"].items()}, blob["gamma"])
        self.offset = done
        self.history = json.loads(blob["history"])[:done]
        self.evaluations = [e for e in json.loads(blob["evaluations"]) if e["round"] <= done]

    def resume(self) -> int:
        """Continue from ``out-dir/checkpoint.pt`` when there is one and ``resume`` is on; returns the
        checkpoint's round (0: the run starts at round 1, and an old checkpoint there is removed)."""
        d = self._out()
        if d is None:
            return 0
        RunDir(d).remove_stale_tmp()  # temporary files of writes killed half-way
        path = d / CHECKPOINT
        if not path.is_file():
            return 0
        if not self.setup.options.resume:
            path.unlink()
            log(INFO, "fedsl: resume = false: removed %s, starting at round 1", path)
            return 0
        self.restore(torch.load(path, map_location="cpu", weights_only=True))
        received = d / "received.json"
        if received.is_file():  # the audit of what arrived before, kept
            try:
                self.received = list(json.loads(received.read_text()))
            except (ValueError, TypeError):
                self.received = []
        log(INFO, "fedsl: resuming from %s at round %d of %d", path, self.offset + 1, self.setup.cfg.rounds)
        if self.tables:
            log(WARNING, "fedsl: %s keeps %s on the clients, which start them over in a new Flower run: the resumed "
                "run is not bit-identical to an uninterrupted one", self.alg.name, ", ".join(self.tables))
        return self.offset
