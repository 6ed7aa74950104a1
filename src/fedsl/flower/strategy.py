"""The server side: fedsl's server update and server learning inside a Flower strategy.

``FedslStrategy`` subclasses Flower's message-API ``FedAvg`` and replaces two steps:

- ``configure_train``: the clients of round t are the simulator's,
  ``rng.sample_clients(seed, t, N, S)``; each is addressed through the node the server assigned
  that partition to (``node-partitions``, or the first connected node that claimed it in its
  reply to a ``query`` message; a node claiming a partition it was not assigned is left out; a
  node whose ClientApp has no ``query`` handler gets the lowest free partition). A sampled client
  whose node is gone is skipped: the round goes on with the others. The train message carries
  x_t, the round, the partition, η_l, E, B (and K), the rule's client-side hyper-parameters and
  the server state its clients read (``train_config``; README, "The Flower protocol").
- ``aggregate_train``: every reply is checked first (``replies.check_reply``: from a node sent a train
  message this round, for its partition and round, the model's array names, shapes and dtype,
  finite values, the metrics as integers, n_i the partition's size); a bad one is logged in one
  line and left out of the round. The usable replies' final models x_i, in client-id order as the simulator
  stacks them, go through the algorithm's server half, ``server_round.server_update``, the
  function the simulator calls: the rule's ``server_update`` (FedAvg: x̄ = x + η_g·mean_i Δ_i,
  the plain mean of Algorithm 1 unless ``algorithm.weighted``; not Flower's weighting by
  example count), then server learning on D0 over the same batches as the simulator's
  (Algorithm 1, line 10: K0 SGD steps with step size γ·η0 from x̄). The strategy's current
  model is the model *after* server learning, and that is what the next round sends out.
  A round without a usable reply (or whose aggregate is not finite) applies no client update:
  x̄ = x_t, then server learning as usual, and the round counts.
- every ``checkpoint_every`` rounds the model, the server state, γ_t and the records are saved
  atomically to ``out-dir/checkpoint.pt`` (the simulator's checkpoint format, ``fedsl.runs.checkpoint``);
  ``resume`` continues a ServerApp from it (``fedsl.flower.strategy_checkpoint``).

The server keeps only the server state (SCAFFOLD's c, FedDyn's h, optimiser moments, γ_t, DP's adaptive C_t): a
rule's server half reads the clients' models, never their states, which stay on the clients
(each updates its own with the rule's ``client_final``; ``fedsl.flower.client``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
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

from fedsl.algorithms.base import ClientResults, LocalSGD, RunState, stack_reply
from fedsl.algorithms.server_round import ServerMetrics, initial_state, server_update
from fedsl.algorithms.spec import CLIENT_MEASURES
from fedsl.config.schema import ConfigError
from fedsl.core import participation, rng
from fedsl.engine.plan import planned_steps
from fedsl.flower.config import FlowerSetup
from fedsl.flower.records import from_record, local_keys, state_to_record, to_record
from fedsl.flower.replies import (  # noqa: F401 - check_reply, BadReply, TRAIN_METRICS re-exported
    TRAIN_METRICS,
    BadReply,
    check_claim,
    check_declared,
    check_open_reply,
    check_reply,
    describe_content,
    lacks_query_handler,
    train_loss,
)
from fedsl.flower.strategy_checkpoint import StrategyCheckpoint, out_folder
from fedsl.runs import checkpoint
from fedsl.runs.build import finetune
from fedsl.runs.checkpoint import Checkpoint, atomic_write


def _flat(text: str | None) -> str:
    """An error reason on one line (Flower's simulation puts the ClientApp's message on a line of its own)."""
    return " ".join((text or "").split())


def mean_reported(values: list[float | None]) -> float | None:
    """The mean of the values reported (None: none was), e.g. the clients' train losses of a round."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _finite(params: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values())


def plain_client_half(rule: object) -> bool:
    """Whether a rule's clients run plain local SGD (FedAvg, FSL, FedAvgM, FedAdam, FedNova, ...): then any
    Flower client that trains and returns its model runs the algorithm. SCAFFOLD, FedDyn, FedProx and MOON
    correct the client's steps, which a stock client does not do."""
    cls = type(rule)
    return (all(getattr(cls, f) is getattr(LocalSGD, f)
                for f in ("client_init", "direction", "client_step", "client_final"))
            and cls.local_loss is None)


class NoNodes(RuntimeError):
    """A ServerApp's round found no usable node within ``node-wait``: round 1 (a fresh run's, or a resumed one's
    first), or a later round after every node was lost."""


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
        checkpoints: ``out-dir/checkpoint.pt``, saved every ``checkpoint_every`` rounds and resumed from.
        node_partition: node id -> the partition the server assigned it (for connected nodes).
    """

    def __init__(self, setup: FlowerSetup, state: RunState | None = None) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_evaluate_nodes=0,
                         min_available_nodes=setup.options.min_nodes, weighted_by_key="num-examples")
        self.setup, self.sim, self.alg = setup, setup.sim, setup.algorithm
        if state is None:
            x = self.sim.initial_params(setup.pretrain)
            state = initial_state(self.alg, x)
        # the server keeps the server state only: each client keeps its own (``fedsl.flower.client``)
        self.state = state.server_part()
        self.assigned: dict[int, int] = dict(setup.options.node_partitions)  # node-partitions (empty: first claim)
        for node, pid in self.assigned.items():
            if not 0 <= pid < setup.num_clients:
                raise ConfigError(f"run config node-partitions {node}:{pid}: expected 0 <= partition id < "
                                  f"{setup.num_clients} (the federation's clients)")
        self.open = setup.options.open  # clients own their data (federation = "open")
        self.nodes: list[int] = []  # an open federation's connected nodes (those not left out), sorted
        self.node_partition: dict[int, int] = {}  # replay: node id -> partition id (client id i)
        self.dropped: set[int] = set()  # nodes left out of the rest of this run
        self.offset = 0
        self.history: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self.checkpoints = StrategyCheckpoint(setup.cfg, setup.options.out_dir, setup.options.resume,
                                              self.sim.device, self.sim.dtype)
        self._pending: dict[str, Any] | None = None
        self.finetuned: dict[str, Any] | None = None  # the fine-tuning control's result (``finish``)
        self._started = False

    def _params(self, record: ArrayRecord):
        """A model's parameters from a record (the model's names, the engine's device and dtype)."""
        return from_record(record, self.sim.device, self.sim.dtype, names=self.sim.fm.names)

    def summary(self) -> None:
        cfg = self.setup.cfg
        log(INFO, "\t├──> fedsl: %s on %s, N=%d, S=%d, %d rounds, seed %d", self.alg.name, cfg.data.dataset,
            self.setup.num_clients, cfg.algorithm.clients_per_round, cfg.rounds, cfg.seed)
        sl = self.alg.server_learning
        if sl is not None and sl.active:
            log(INFO, "\t└──> server learning (%s) on n0=%d: γ=%g, η0=%g, B0=%d", sl.mode, self.sim.fed.n0,
                sl.gamma, sl.lr, sl.batch_size)

    # ------------------------------------------------------------------ nodes

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
        """Learn the partition ``nodes`` claim (a ``query`` message each) and assign it, or leave them out.

        A node whose ClientApp has no ``query`` handler (a plain Flower client: Flower answers with an
        error) is assigned a partition by the server: the one ``node-partitions`` lists for it, else the
        lowest partition id no node holds (after this round of claims; in node-id order).
        """
        msgs = [Message(RecordDict({"config": ConfigRecord({"want": "partition-id"})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=self.setup.options.round_timeout))
        answered, plain = set(), []
        # lowest node id first: of two new nodes claiming one partition, the lower id gets it
        for msg in sorted(replies, key=lambda m: m.metadata.src_node_id):
            node = msg.metadata.src_node_id
            self.record_reply("query", msg)
            if node not in nodes or node in answered:
                log(WARNING, "fedsl: ignoring a query reply of node %d: it was not asked, or answered twice", node)
                continue
            answered.add(node)
            if lacks_query_handler(msg):
                plain.append(node)
                continue
            if msg.has_error():  # e.g. a missing or bad partition-id in the node's config
                log(WARNING, "fedsl: node %d left out of the run: %s", node, _flat(msg.error.reason))
                continue
            try:
                pid = check_claim(msg, self.setup.num_clients)
            except BadReply as e:
                log(WARNING, "fedsl: node %d left out of the run: %s", node, e)
                continue
            why = self._assignment_error(node, pid)
            if why is not None:
                log(WARNING, "fedsl: node %d left out of the run: %s", node, why)
                continue
            self.node_partition[node] = pid
        for node in plain:
            pid = self._free_partition(node)
            if pid is None:
                why = "not in node-partitions" if self.assigned else "every partition is held by another node"
                log(WARNING, "fedsl: node %d (no query handler) left out of the run: %s", node, why)
                continue
            log(INFO, "fedsl: node %d has no query handler: the server assigns it partition %d", node, pid)
            self.node_partition[node] = pid
        for n in nodes:
            if n not in self.node_partition:
                self.dropped.add(n)  # no (valid) answer, or a partition it was not assigned

    def no_nodes(self, what: str) -> None:
        """No node to train, within node-wait: fail now, not after the remaining rounds of server learning alone
        (whose checkpoints would leave a resumed run's out-dir looking finished). Rounds done since the last
        checkpoint are checkpointed first (when checkpointing is on), so the repeated run loses none of them.
        min-nodes = 0 asks to go on."""
        if self.min_available_nodes < 1:
            return
        done = len(self.history)
        if done > self.offset and self.setup.cfg.checkpoint_every and \
                self.checkpoints.save(self.state, self.history, self.evaluations) is not None:
            self.offset = done  # the round the repeated run continues after
        again = f", which continues from round {self.offset + 1}" if self.offset else ""
        failure = NoNodes(f"fedsl: no SuperNode {what} within node-wait = {self.setup.options.node_wait:g} s "
                          f"(min-nodes = {self.min_available_nodes}): start the SuperNodes (after a SuperLink restart "
                          f"on in-memory state, restart them too) and repeat the same flwr run{again}")
        self.fail(str(failure))  # out-dir/failed.json; the checkpoint stays, for the run repeated
        raise failure

    def _free_partition(self, node: int) -> int | None:
        """The partition the server assigns a node that claims none (None: no partition for it)."""
        held = set(self.node_partition.values())
        if self.assigned:
            pid = self.assigned.get(node)
            return pid if pid is not None and pid not in held else None
        return next((i for i in range(self.setup.num_clients) if i not in held), None)

    def _refresh_nodes(self, grid: Grid, first: bool) -> None:
        """The nodes of this round: round 1 waits up to node-wait for min-nodes of them; a later round goes on with
        the nodes there are, and waits (then fails: ``no_nodes``) only when it has none, with min-nodes ≥ 1."""
        need = self.min_available_nodes if first else min(self.min_available_nodes, 1)
        deadline = time.monotonic() + self.setup.options.node_wait if first else None
        while True:
            connected = set(grid.get_node_ids()) - self.dropped
            if self.open:  # no partitions to learn: every connected node is a client
                self.nodes = sorted(connected)
                usable, what = len(self.nodes), "connected"
            else:
                for gone in set(self.node_partition) - connected:
                    del self.node_partition[gone]  # its partition is free again (e.g. for the node restarted)
                unknown = sorted(connected - set(self.node_partition))
                if unknown:
                    self._query(grid, unknown)
                usable, what = len(self.node_partition), "holds a partition of the run"
            if usable >= need:
                return
            if deadline is None:  # a later round that lost every node: wait for one as round 1 waits
                deadline = time.monotonic() + self.setup.options.node_wait
            if time.monotonic() >= deadline:
                if not usable:
                    self.no_nodes(what)
                return
            log(INFO, "fedsl: waiting for nodes: %d %s (minimum %d)", usable,
                "connected" if self.open else "known", need)
            time.sleep(1.0)

    # ------------------------------------------------------------------ train

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send x_t (and the server state the clients need) to the nodes of the sampled clients."""
        t = self.offset + server_round - 1
        first, self._started = not self._started, True
        if first and len(arrays):  # x_0 as given to ``start`` (later rounds: our own x_{t}, after SL)
            self.state = self.state.with_x(self._params(arrays))
        self._refresh_nodes(grid, first=first)
        cfg = self.setup.cfg
        steps: dict[int, int] = {}
        drop: frozenset[int] = frozenset()
        if self.open:  # S of the connected nodes, seeded; a client is its node (ids up to 2^64: Python ints)
            sampled = rng.sample_nodes(cfg.seed, t, self.nodes, cfg.algorithm.clients_per_round)
            targets, missing = {n: n for n in sampled}, []
            log(INFO, "fedsl round %d: nodes %s sampled of %d connected", t + 1, sampled, len(self.nodes))
        else:
            # S clients (of the available ones: algorithm.availability), the simulator's draw
            part = cfg.participation
            ids = participation.sample(cfg.seed, t, self.setup.num_clients, cfg.algorithm.clients_per_round, part)
            sampled = ids.tolist()
            steps, drop = self._stragglers(t, ids, part)
            by_partition = {pid: node for node, pid in self.node_partition.items()}  # one node per partition
            targets = {int(i): by_partition[int(i)] for i in ids if int(i) in by_partition}
            missing = [int(i) for i in ids if int(i) not in by_partition]
            log(INFO, "fedsl round %d: clients %s sampled, %d reachable%s", t + 1, ids.tolist(), len(targets),
                f" (no node for {missing})" if missing else "")
        model = to_record(self.state.x)
        server_state = self.sim.sent(self.state)  # what the clients read of the server state (SCAFFOLD: c)
        messages = []
        for pid, node in targets.items():
            content = RecordDict({"arrays": model,
                                  "config": ConfigRecord({**dict(config), **self.train_config(t, pid,
                                                                                               steps.get(pid))})})
            if server_state:
                content["server-state"] = state_to_record(server_state)
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        self._pending = {"t": t, "sampled": sampled, "targets": targets, "missing": missing,
                         "started": time.time(), "drop": drop}
        return messages

    def _stragglers(self, t: int, ids: np.ndarray, part: participation.Participation
                    ) -> tuple[dict[int, int], frozenset[int]]:
        """Round t's simulated stragglers among the sampled ``ids``, as the simulator draws them: the steps K'_i
        of each partial one (sent as ``local-steps``), and the dropped ones (their replies will be ignored)."""
        if part.full:
            return {}, frozenset()
        loc = self.alg.local
        planned = tuple(planned_steps(len(self.sim.client_data[int(i)]), loc.batch_size, loc.epochs, loc.steps)
                        for i in ids)
        steps, drop = participation.stragglers(self.setup.cfg.seed, t, ids, planned, part)
        return {int(i): k for i, k, k0 in zip(ids, steps, planned) if k != k0}, drop

    def train_config(self, t: int, pid: int, steps: int | None = None) -> dict[str, Any]:
        """The ConfigRecord ``config`` of round t's train message to the node of partition ``pid`` (an open
        federation: to node ``pid``, and no partition is named): what a client needs to run the round's client
        update (docs/reference/flower-protocol.md); ``steps``: a simulated straggler's K'_i
        (algorithm.straggler_mode = 'partial')."""
        loc, rule = self.alg.local, self.alg.rule
        out: dict[str, Any] = {"server-round": t + 1, "round": t, "algorithm": self.alg.name,
                               "lr": float(loc.lr), "local-epochs": int(loc.epochs), "batch-size": int(loc.batch_size)}
        if not self.open:
            out.update({"partition-id": pid, "num-partitions": self.setup.num_clients})
        if loc.steps is not None:
            out["local-steps"] = int(loc.steps)
        if steps is not None:
            out["local-steps"] = int(steps)
        for attr, key in local_keys(self.alg.spec).items():
            value = getattr(rule, attr, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = float(value)
        return out

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
        losses: dict[int, float | None] = {}  # pid -> the reply's train-loss (None: not reported)
        declared: dict[int, dict] = {}  # pid -> what the rule's spec declares its clients reply (q-FedAvg's F_i(x_t))
        for msg in replies:
            node = msg.metadata.src_node_id
            self.record_reply("train", msg, t)
            pid = node_to_pid.get(node)
            if pid is None or node in seen:
                why = "a second reply this round" if node in seen else "it was sent no train message this round"
                log(WARNING, "fedsl round %d: dropped a reply of node %d: %s", t + 1, node, why)
                rejected.append({"node": node, "partition": pid, "reason": why})
                continue
            seen.add(node)
            if msg.has_error():
                failed[node] = _flat(msg.error.reason)
                continue
            try:
                if self.open:
                    arrays, n_i, k_i, losses[pid] = self._open_reply(msg, t)
                else:
                    # n_i weighs the update (algorithm.weighted, FSL-p): the federation, rebuilt from the
                    # seed on every machine, says what it is
                    arrays, n_i, k_i = check_reply(msg, self.state.x, pid, t, len(self.sim.client_data[pid]))
                    losses[pid] = train_loss(msg)
                    declared[pid] = {k: self._tensors(check_declared(msg, CLIENT_MEASURES[k], self.state.x,
                                                                     self.alg.name))
                                     for k in (self.alg.spec.reply if self.alg.spec is not None else ())}
            except BadReply as e:
                where = "" if self.open else f" (partition {pid})"
                log(WARNING, "fedsl round %d: dropped the reply of node %d%s: %s", t + 1, node, where, e)
                rejected.append({"node": node, "partition": pid, "reason": str(e)})
                if e.impostor:
                    impostors.add(node)
                continue
            finals[pid] = (self._tensors(arrays), n_i, k_i)
        # no reply in time, an error or another partition's reply: left out for the rest of the run
        # (a reply that was merely unusable leaves its node in the run: it gets x_{t+1} next time)
        bad_content = {r["node"] for r in rejected if r["partition"] is not None} - impostors
        lost = [node for pid, node in targets.items() if pid not in finals and node not in bad_content]
        for node in lost:
            self.dropped.add(node)
            self.node_partition.pop(node, None)
            if node not in impostors:
                where = "" if self.open else f" (partition {node_to_pid[node]})"
                log(WARNING, "fedsl round %d: no update from node %d%s: %s", t + 1, node, where,
                    failed.get(node, "no reply within round-timeout"))
        drop = sorted(pid for pid in pending.get("drop", ()) if pid in finals)
        if drop:  # simulated stragglers (algorithm.straggler_mode = 'drop'): trained, but their update is lost
            log(INFO, "fedsl round %d: updates of stragglers %s dropped (algorithm.straggler_fraction)", t + 1, drop)
        ids = sorted(set(finals) - set(drop))
        if not ids and targets:
            log(WARNING, "fedsl round %d: no usable client update (%d sent, %d replies dropped): x̄ = x_t, "
                "then server learning", t + 1, len(targets), len(rejected))
        self.state, m, applied = self.run_server_half(t, ids, finals, declared)  # the model after server learning
        ids = ids if applied else []
        server_steps, cos, gamma = m.server_steps, m.cos_theta, m.gamma
        info = {"round": t + 1, "t": t, "sampled": pending["sampled"], "missing": pending["missing"],
                "trained": ids, "lost_partitions": [node_to_pid[n] for n in lost], "rejected": rejected,
                "client_steps": [finals[i][2] for i in ids], "train_loss": mean_reported([losses[i] for i in ids]),
                "server_steps": server_steps, "gamma": gamma,
                "cos_theta": cos, "seconds": round(time.time() - pending["started"], 3)}
        if m.distill_steps:  # FedDF: distillation steps taken on the server's unlabelled data
            info["distill_steps"] = m.distill_steps
        if drop:
            info["straggler_dropped"] = drop
        self.record_round(info)
        metrics = MetricRecord({"clients": len(ids), "server-steps": server_steps})
        if info["train_loss"] is not None:
            metrics["train-loss"] = info["train_loss"]
        return to_record(self.state.x), metrics

    def record_round(self, info: dict[str, Any]) -> None:
        """Round ``info["t"]`` is done: its line in ``rounds.json`` (with DP's ε after it, privacy.clip), and the
        checkpoint when one is due."""
        if self.setup.privacy is not None:
            info["epsilon"] = self.setup.privacy.epsilon(info["t"] + 1)
        self.history.append(info)
        t, every = info["t"], self.setup.cfg.checkpoint_every
        if every and ((t + 1) % every == 0 or t + 1 == self.setup.cfg.rounds):
            self.checkpoints.save(self.state, self.history, self.evaluations)
        self._write()

    def _open_reply(self, msg: Message, t: int) -> tuple[dict, int, int, float | None]:
        """An open federation's reply: x_i, n_i as reported (bounded by ``max-examples``), K_i (the reply's
        ``steps``, else derived from what the server sent: K, or E·⌈n_i/B⌉) and the loss it reports.

        Raises:
            BadReply: the reply is unusable, or the rule corrects the client's steps (SCAFFOLD, FedDyn, ...) and
                the reply has no ``steps``: it came from a client that does not run the rule's client half.
        """
        arrays, n_i, k_i, loss = check_open_reply(msg, self.state.x, t, self.setup.options.max_examples)
        return arrays, n_i, self.open_steps(n_i, k_i), loss

    def open_steps(self, n_i: int, k_i: int | None) -> int:
        """K_i of an open-federation reply: its ``steps`` metric, else derived from what the server sent (K, or
        E·⌈n_i/B⌉).

        Raises:
            BadReply: no ``steps``, and the rule corrects the client's steps (SCAFFOLD, FedDyn, ...): the reply came
                from a client that does not run the rule's client half.
        """
        if k_i is not None:
            return k_i
        if not plain_client_half(self.alg.rule):
            raise BadReply(f"algorithm {self.alg.name!r} corrects the clients' local steps, and this reply has no "
                           "'steps' metric (a stock client, which runs plain local SGD): use a client that runs "
                           "the rule's client half (fedsl's ClientApp), or a plain-SGD algorithm (fedavg, fsl)")
        loc = self.alg.local
        return planned_steps(n_i, loc.batch_size, loc.epochs, loc.steps)

    def _tensors(self, value):
        """A reply's arrays (numpy, by name) as tensors on the server's device and dtype; a number as it is."""
        if not isinstance(value, dict):
            return value
        return {n: torch.from_numpy(np.array(value[n], copy=True)).to(device=self.sim.device, dtype=self.sim.dtype)
                for n in self.sim.fm.names}

    def run_server_half(self, t: int, ids: list[int], finals: dict, declared: dict[int, dict] | None = None
                        ) -> tuple[RunState, ServerMetrics, bool]:
        """The algorithm's server half (``server_round.server_update``: the rule's update, FSL-p, line 10,
        γ) on the usable replies of clients ``ids`` (none: x̄ = x_t, then server learning as usual); and
        whether their update was applied. ``finals``: client id -> (x_i, n_i, K_i); ``declared``: client id -> what
        the rule's spec declares its clients send beside x_i, by name (q-FedAvg's F_i(x_t)). The new state is the
        caller's to keep (``state``); SecAgg+'s rounds (``fedsl.flower.secagg``) call it too."""
        sim = self.sim
        state = self.state.with_x(sim.layout(self.state.x))
        results = None
        if ids:
            names = self.alg.spec.reply if self.alg.spec is not None and declared else ()
            results = ClientResults({n: torch.stack([finals[i][0][n] for i in ids]) for n in state.x},
                                    [finals[i][1] for i in ids], tuple(finals[i][2] for i in ids),
                                    () if self.open else tuple(ids),  # open: node ids, not client ids
                                    {k: stack_reply([declared[i][k] for i in ids], sim.device) for k in names})
        new, metrics = server_update(self.alg, state, results, t, sim.server)
        if results is not None and not (_finite(new.x) and all(_finite(v) for v in new.algo.values())):
            # finite replies whose aggregate (or server learning from it) overflows
            log(WARNING, "fedsl round %d: the update from clients %s is not finite (values too large): "
                "no client update applied", t + 1, ids)
            new, metrics = server_update(self.alg, state, None, t, sim.server)
            return new, metrics, False
        return new, metrics, results is not None

    # ------------------------------------------------------------------ evaluation and records

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Central evaluation of the current model on the server's test set (the rounds ``cfg.evaluates``)."""
        cfg = self.setup.cfg
        r = self.offset + server_round
        if not cfg.evaluates(r) or any(e["round"] == r for e in self.evaluations):
            return None
        params = self._params(arrays) if len(arrays) else self.state.x
        acc, loss = self.sim.evaluate(params)
        # eval_per_client (a replayed federation: the server rebuilds every client's partition), as the simulator
        self.evaluations.append({"round": r, "accuracy": acc, "loss": loss,
                                 **(self.sim.evaluate_clients(params) if cfg.eval_per_client else {})})
        self._write()
        return MetricRecord({"accuracy": acc, "loss": loss})

    def record_reply(self, kind: str, msg: Message, t: int | None = None) -> None:
        """What a reply of round t carried (or its error), appended to ``received`` (``received.json``)."""
        entry: dict[str, Any] = {"kind": kind, "round": t, "node": msg.metadata.src_node_id}
        if msg.has_error():
            entry["error"] = msg.error.reason
        else:
            entry.update(describe_content(msg.content))
        self.received.append(entry)

    def _out(self) -> Path | None:
        return out_folder(self.setup.options.out_dir)

    def resume(self) -> int:
        """Continue from ``out-dir/checkpoint.pt`` when there is one and ``resume`` is on; returns the
        checkpoint's round (0: the run starts at round 1, and an old checkpoint there is removed)."""
        resumed = self.checkpoints.resume()
        if resumed is None:
            return 0
        self.state, self.offset = resumed.state, resumed.round
        self.history, self.evaluations = resumed.history, resumed.evaluations
        if resumed.received is not None:
            self.received = resumed.received
        tables = list(self.alg.rule.init_client_state(self.state.x))
        if tables:
            log(WARNING, "fedsl: %s keeps %s on the clients, which start them over in a new Flower run: the resumed "
                "run is not bit-identical to an uninterrupted one", self.alg.name, ", ".join(tables))
        return self.offset

    def _write(self, final: bool = False) -> None:
        d = self._out()
        if d is None:
            return
        for name, data in (("rounds.json", self.history), ("received.json", self.received),
                           ("evaluations.json", self.evaluations)):
            text = json.dumps(data, indent=1, default=str)
            atomic_write(d / name, lambda p, text=text: p.write_text(text))
        if final:
            # x_T, the server state and γ_T in the checkpoints' format (``fedsl.runs.checkpoint.load``)
            checkpoint.save(d / "final.pt", Checkpoint(len(self.history), self.state))
            done = {"status": "completed", "rounds": len(self.history), "federation": self.setup.options.federation,
                    **(self.finetuned or {})}
            if self.setup.privacy is not None:
                done["privacy"] = self.setup.privacy.record(len(self.history))
            atomic_write(d / "done.json", lambda p: p.write_text(json.dumps(done)))
            (d / "failed.json").unlink(missing_ok=True)  # an earlier attempt's, now resumed and completed

    def fail(self, reason: str) -> None:
        """Record a failed run in ``out-dir/failed.json`` (its one-line reason): Flower's ``flwr run`` exits 0
        whatever the ServerApp did, so this file (or ``flwr ls --run-id ID``'s status) is how a script knows."""
        d = self._out()
        if d is not None:
            text = json.dumps({"status": "failed", "reason": reason, "rounds": len(self.history)})
            atomic_write(d / "failed.json", lambda p: p.write_text(text))

    def finish(self) -> None:
        """Write the final model (``final.pt``) and ``done.json`` to ``out-dir``; with ``server.finetune_epochs``,
        first the 'FedAvg, then fine-tune on D0' control (``build.finetune``), its accuracy in done.json."""
        self.finetuned = finetune(self.sim, self.setup.cfg, self.state.x)
        if self.finetuned is not None:
            log(INFO, "fedsl: fine-tuned on D0 for %d epochs: test accuracy %.4f",
                self.finetuned["finetune"]["epochs"], self.finetuned["final_accuracy_finetuned"])
        self._write(final=True)
