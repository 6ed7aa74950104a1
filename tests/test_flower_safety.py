"""The Flower server does not trust replies (issue 13, item 7), in one process.

The ClientApps run in this process behind a Grid (as in ``test_flower``), and some of them are
made to misbehave: a NaN, a wrong shape or dtype, a missing or mistyped metric, a stale round,
another partition's id, a node claiming a partition it was not assigned. Each bad reply is
dropped from its round with one log line naming the node, and the run goes on to a finite model
(the same model as a run without that client, where that can be compared). The ServerApp writes
a checkpoint every ``checkpoint_every`` rounds and a restarted one continues from it, bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.usefixtures("flower_task_identity")

from conftest import FLOWER_RUN, max_diff, run_rounds
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict

from fedsl.config.schema import ConfigError
from fedsl.flower import FedslStrategy, load_setup, make_client_app, parse_run_config
from fedsl.flower.records import to_record
from fedsl.flower.server import run_server
from fedsl.runs import checkpoint
from fedsl.runs.build import prepare
from fedsl.runs.checkpoint import CorruptCheckpoint

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"

# FSL on a tiny MLP in float64; every client sampled every round (S = N = 4)
BASE = {**FLOWER_RUN, "algorithm.clients_per_round": 4, "node-wait": 0.0}
HONEST = {100 + i: i for i in range(4)}  # node id -> the partition-id in its node config

Tamper = Callable[[Message, Message], Message]  # (train message, honest reply) -> what the node sends


class Crash(RuntimeError):
    """The ServerApp's process dies (raised by the grid)."""


class Nodes:
    """ClientApps in this process behind Flower's Grid (``send_and_receive``, and ``push_messages`` /
    ``pull_messages`` for the ServerApp's ``RoundGrid``); one Context (and state) per node.

    Args:
        partitions: node id -> partition-id of its node config.
        tamper: node id -> what it sends instead of its honest train reply.
        late: node id -> the ``get_node_ids`` call from which on it is connected (1 = from the start).
        gone: node id -> the ``get_node_ids`` call from which on it is disconnected.
        crash_at: the train message (1-based count) at whose sending the ServerApp crashes.
    """

    def __init__(self, run_config: dict, partitions: dict[int, int], tamper: dict[int, Tamper] | None = None,
                 late: dict[int, int] | None = None, gone: dict[int, int] | None = None,
                 crash_at: int | None = None) -> None:
        self.app = make_client_app(APP)
        self.contexts = {node: Context(run_id=1, node_id=node, node_config={"partition-id": pid}, state=RecordDict(),
                                       run_config=run_config) for node, pid in partitions.items()}
        self.tamper, self.late, self.gone, self.crash_at = tamper or {}, late or {}, gone or {}, crash_at
        self.calls, self.sent, self._replies = 0, [], {}

    def trains_to(self, node: int) -> int:
        return sum(m.metadata.dst_node_id == node and m.metadata.message_type == "train" for m in self.sent)

    def get_node_ids(self) -> list[int]:
        self.calls += 1
        return [n for n in self.contexts if self.late.get(n, 1) <= self.calls < self.gone.get(n, 10**9)]

    def _reply(self, msg: Message) -> Message:
        msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
        self.sent.append(msg)
        node = msg.metadata.dst_node_id
        if msg.metadata.message_type == "train" and self.crash_at == sum(
                m.metadata.message_type == "train" for m in self.sent):
            raise Crash(f"the ServerApp crashed sending train message {self.crash_at}")
        try:
            reply = self.app(msg, self.contexts[node])
        except Exception as e:  # noqa: BLE001 - what a SuperNode sends back when the ClientApp raises
            return Message(Error(code=1, reason=str(e)), reply_to=msg)
        if msg.metadata.message_type == "train" and node in self.tamper:
            reply = self.tamper[node](msg, reply)
        return reply

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        return [self._reply(m) for m in messages]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for m in messages:
            reply = self._reply(m)  # stamps the message id
            self._replies[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, ids) -> list[Message]:
        return [self._replies.pop(i) for i in list(ids) if i in self._replies]


def run_flower(run_config: dict, partitions: dict[int, int] | None = None, **grid_kw) -> tuple[FedslStrategy, Nodes]:
    setup = load_setup(run_config)
    grid = Nodes(run_config, partitions or HONEST, **grid_kw)
    strategy = FedslStrategy(setup)
    strategy.start(grid, to_record(strategy.state.x), num_rounds=setup.cfg.rounds, timeout=5.0)
    return strategy, grid


def finite(params: dict) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values())


def edit(arrays: Callable[[dict], dict] | None = None, metrics: Callable[[dict], dict] | None = None,
         records: Callable[[dict], dict] | None = None) -> Tamper:
    """A node that changes its honest reply: its arrays (name -> numpy array, or -> Array), its metrics,
    or its records."""
    def tamper(msg: Message, reply: Message) -> Message:
        content = reply.content
        recs = {"arrays": content.array_records["arrays"], "metrics": content.metric_records["metrics"]}
        if arrays is not None:
            new = arrays({n: a.numpy().copy() for n, a in recs["arrays"].items()})
            recs["arrays"] = ArrayRecord({n: a if isinstance(a, Array) else Array(np.ascontiguousarray(a))
                                          for n, a in new.items()})
        if metrics is not None:
            recs["metrics"] = MetricRecord(metrics(dict(recs["metrics"])))
        if records is not None:
            recs = records(recs)
        return Message(RecordDict(recs), reply_to=msg)
    return tamper


def _first(d: dict) -> str:
    return next(iter(d))


def _nan(a: dict) -> dict:
    a[_first(a)].flat[0] = np.nan
    return a


def _inf(a: dict) -> dict:
    a[_first(a)].flat[-1] = -np.inf
    return a


def _shape(a: dict) -> dict:
    n = _first(a)
    a[n] = a[n].reshape(-1)[:-1]
    return a


def _declared_shape(a: dict) -> dict:  # Flower's metadata says the right shape, the bytes hold another
    n = _first(a)
    honest = Array(np.ascontiguousarray(a[n]))
    lying = Array(np.ascontiguousarray(a[n].reshape(-1)))
    return {**a, n: Array(dtype=honest.dtype, shape=honest.shape, stype=honest.stype, data=lying.data)}


def _drop_metric(key: str) -> Callable[[dict], dict]:
    return lambda m: {k: v for k, v in m.items() if k != key}


BAD_REPLIES = {
    "nan": (edit(arrays=_nan), "non-finite value (NaN or inf)"),
    "inf": (edit(arrays=_inf), "non-finite value (NaN or inf)"),
    "wrong shape": (edit(arrays=_shape), "shape ["),
    "shape lie": (edit(arrays=_declared_shape), "holds shape ["),
    "wrong dtype": (edit(arrays=lambda a: {n: v.astype(np.float32) for n, v in a.items()}), "dtype float32: expected "
                                                                                            "float64"),
    "missing array": (edit(arrays=lambda a: {n: v for n, v in list(a.items())[1:]}), "missing ["),
    "extra array": (edit(arrays=lambda a: {**a, "backdoor": np.zeros(3)}), "unexpected ['backdoor']"),
    "no arrays": (edit(records=lambda r: {"metrics": r["metrics"]}), "no ArrayRecord 'arrays'"),
    "no metrics": (edit(records=lambda r: {"arrays": r["arrays"]}), "no MetricRecord 'metrics'"),
    "no partition-id": (edit(metrics=_drop_metric("partition-id")), "metric partition-id missing"),
    "no steps": (edit(metrics=_drop_metric("steps")), "metric steps missing"),
    "no round": (edit(metrics=_drop_metric("round")), "metric round missing"),
    "no num-examples": (edit(metrics=_drop_metric("num-examples")), "metric num-examples missing"),
    "float steps": (edit(metrics=lambda m: {**m, "steps": 3.0}), "steps = 3.0: expected an integer"),
    "zero steps": (edit(metrics=lambda m: {**m, "steps": 0}), "steps = 0: expected >= 1"),
    "inflated num-examples": (edit(metrics=lambda m: {**m, "num-examples": 10**9}), "partition 1 has 24 samples"),
    "stale round": (edit(metrics=lambda m: {**m, "round": m["round"] - 1}), "stale or replayed"),
}


# ----------------------------------------------------------------------------- bad replies

@pytest.mark.parametrize("kind", list(BAD_REPLIES))
def test_a_bad_reply_is_dropped_from_its_round_and_the_run_completes(one_thread, caplog, kind):
    """Node 101 (partition 1) sends a bad reply every round: it is dropped every round with one log line,
    and the model is the one of a run without partition 1 (bit for bit), finite."""
    tamper, needle = BAD_REPLIES[kind]
    strategy, grid = run_flower(BASE, tamper={101: tamper})
    assert len(strategy.history) == BASE["rounds"] and finite(strategy.state.x)
    for h in strategy.history:
        assert h["trained"] == [0, 2, 3] and h["lost_partitions"] == [] and h["server_steps"] > 0
        assert [(r["node"], r["partition"]) for r in h["rejected"]] == [(101, 1)]
        assert needle in h["rejected"][0]["reason"], h["rejected"][0]["reason"]
    # an unusable reply costs its round only: the node is sent x_t again in every round
    assert 101 not in strategy.dropped and grid.trains_to(101) == BASE["rounds"]
    lines = [r.getMessage() for r in caplog.records if "dropped the reply of node 101" in r.getMessage()]
    assert len(lines) == BASE["rounds"] and all(needle in line and "\n" not in line for line in lines)
    without, _ = run_flower(BASE, partitions={100: 0, 102: 2, 103: 3})
    assert max_diff(strategy.state.x, without.state.x) == 0.0


def test_a_round_whose_replies_are_all_dropped_applies_no_client_update(one_thread, caplog):
    """Every node sends NaN: no client update is applied (x̄ = x_t), server learning still runs and
    the rounds count: x_{t+1} is K0 server steps on D0 from x_t."""
    strategy, _ = run_flower(BASE, tamper={node: edit(arrays=_nan) for node in HONEST})
    assert len(strategy.history) == BASE["rounds"] and finite(strategy.state.x)
    assert all(h["trained"] == [] and len(h["rejected"]) == 4 and h["server_steps"] > 0 for h in strategy.history)
    assert sum("no usable client update" in r.getMessage() for r in caplog.records) == BASE["rounds"]
    cfg, _ = parse_run_config(BASE)
    sim = prepare(cfg).sim
    state = sim.initial_state()
    x, sl = state.x, sim.alg.server_learning
    for t in range(cfg.rounds):
        x, _ = sim.server_sgd(x, t, sl.gamma_at(t, state.gamma) * sl.lr)
    assert max_diff(strategy.state.x, x) == 0.0


def test_an_aggregate_that_overflows_is_not_applied(one_thread, caplog):
    """Finite but huge values (each reply passes) whose mean overflows: the round applies no client update."""
    huge = edit(arrays=lambda a: {n: np.full_like(v, 1e308) for n, v in a.items()})
    strategy, _ = run_flower({**BASE, "rounds": 1}, tamper={100: huge, 101: huge})
    assert finite(strategy.state.x) and strategy.history[0]["trained"] == []
    assert any("is not finite" in r.getMessage() for r in caplog.records)


def test_a_reply_from_a_node_that_was_sent_nothing_is_dropped(one_thread, caplog):
    """Node 100 also answers for node 104, which was never sent a train message (nor connected)."""
    def forge(msg: Message, reply: Message) -> Message:
        forged = Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                     "metrics": MetricRecord({**dict(reply.content.metric_records["metrics"]),
                                                              "partition-id": 1})}), reply_to=msg)
        forged.metadata.__dict__["_src_node_id"] = 104
        return [reply, forged]

    class Forging(Nodes):
        def send_and_receive(self, messages, *, timeout=None):
            out = []
            for m in messages:
                r = self._reply(m)
                out.extend(r if isinstance(r, list) else [r])
            return out

    setup = load_setup(BASE)
    grid = Forging(BASE, HONEST, tamper={100: forge})
    strategy = FedslStrategy(setup)
    strategy.start(grid, to_record(strategy.state.x), num_rounds=BASE["rounds"], timeout=5.0)
    assert all(h["trained"] == [0, 1, 2, 3] for h in strategy.history) and finite(strategy.state.x)
    assert all([(r["node"], r["partition"]) for r in h["rejected"]] == [(104, None)] for h in strategy.history)
    assert any("reply of node 104: it was sent no train message" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- partition assignment

def test_a_reply_claiming_another_partition_is_dropped_and_its_node_left_out(one_thread, caplog):
    """Node 101 was sent partition 1 and replies as partition 2: dropped, and not addressed again."""
    strategy, grid = run_flower(BASE, tamper={101: edit(metrics=lambda m: {**m, "partition-id": 2})})
    first = strategy.history[0]
    assert first["trained"] == [0, 2, 3] and first["lost_partitions"] == [1]
    assert "claims partition-id 2, but the server sent it partition 1" in first["rejected"][0]["reason"]
    assert all(h["trained"] == [0, 2, 3] and h["missing"] == [1] for h in strategy.history[1:])
    assert 101 in strategy.dropped and grid.trains_to(101) == 1 and finite(strategy.state.x)
    assert any("node 101 (partition 1): claims partition-id 2" in r.getMessage() for r in caplog.records)


def test_node_partitions_assigns_partitions_and_an_impostor_is_left_out(one_thread, caplog):
    """The server's assignment (node-partitions): nodes 50 and 99, not listed, claim partitions 1 and 2
    (held by nodes 101 and 102). Neither trains; the run is the simulator's, bit for bit."""
    rc = {**BASE, "node-partitions": "100:0, 101:1, 102:2, 103:3"}
    partitions = {**HONEST, 50: 1, 99: 2}  # lower node ids than the holders': first in line before
    strategy, grid = run_flower(rc, partitions=partitions)
    assert grid.trains_to(50) == grid.trains_to(99) == 0 and {50, 99} <= strategy.dropped
    assert strategy.node_partition == HONEST
    messages = [r.getMessage() for r in caplog.records]
    assert any("node 50 left out of the run: it claims partition-id 1 but is not in node-partitions" in m
               for m in messages)
    cfg, _ = parse_run_config(rc)
    expected, infos = run_rounds(prepare(cfg).sim, cfg.rounds)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert max_diff(strategy.state.x, expected.x) == 0.0

    # a listed node claiming another partition than the one it was assigned
    rc = {**BASE, "node-partitions": "100:0,101:1,102:2,103:3"}
    strategy, grid = run_flower(rc, partitions={100: 0, 101: 2, 102: 2, 103: 3})
    assert grid.trains_to(101) == 0 and 101 in strategy.dropped
    assert all(h["missing"] == [1] and h["trained"] == [0, 2, 3] for h in strategy.history)
    assert any("node 101 left out of the run: it claims partition-id 2 but node-partitions assigns it partition 1"
               in r.getMessage() for r in caplog.records)


def test_without_node_partitions_a_late_claim_of_an_assigned_partition_is_refused(one_thread, caplog):
    """No node-partitions: a partition goes to the first node that claims it and stays with it; node 50
    (a lower node id) connects in round 2 claiming partition 1, which node 101 holds."""
    strategy, grid = run_flower(BASE, partitions={**HONEST, 50: 1}, late={50: 2})
    assert grid.trains_to(50) == 0 and 50 in strategy.dropped and strategy.node_partition == HONEST
    assert grid.trains_to(101) == BASE["rounds"]
    assert any("node 50 left out of the run: it claims partition-id 1, already assigned to node 101" in r.getMessage()
               for r in caplog.records)
    cfg, _ = parse_run_config(BASE)
    expected, _ = run_rounds(prepare(cfg).sim, cfg.rounds)
    assert max_diff(strategy.state.x, expected.x) == 0.0


@pytest.mark.parametrize("value, needle", [("100:0,101", "'101'"), ("100:9", "'100:9'"), ("a:1", "'a:1'"),
                                           ("100:0,100:1", "node 100 is listed twice"),
                                           ("100:0,101:0", "partition 0 is assigned to nodes 100 and 101")])
def test_bad_node_partitions_are_refused_in_one_line(value, needle):
    with pytest.raises(ConfigError) as err:
        parse_run_config({**BASE, "node-partitions": value})
    assert needle in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- checkpoint and resume

def serve(run_config: dict, **grid_kw) -> FedslStrategy:
    """The ServerApp's ``run_server`` on nodes in this process (a new Flower run: new client contexts)."""
    return run_server(Nodes(run_config, HONEST, **grid_kw), Context(run_id=1, node_id=0, node_config={},
                                                                    state=RecordDict(), run_config=run_config))


def test_the_server_checkpoints_and_a_restarted_server_app_continues_bit_for_bit(one_thread, tmp_path):
    """checkpoint_every = 2 of 5 rounds; the ServerApp dies in round 4 and is started again on the same
    out-dir: it continues from round 3 and ends with the uninterrupted run's model and records."""
    rc = {**BASE, "rounds": 5, "checkpoint_every": 2, "eval_every": 1, "algorithm.clients_per_round": 2}
    whole = serve({**rc, "out-dir": str(tmp_path / "whole")})
    out = tmp_path / "out"
    rc = {**rc, "out-dir": str(out)}
    with pytest.raises(Crash):
        serve(rc, crash_at=2 * 3 + 1)  # the first train message of round 4
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 2 and len(json.loads((out / "rounds.json").read_text())) == 3
    assert not (out / "final.pt").exists() and not list(out.glob(".*.tmp"))
    cfg, _ = parse_run_config(rc)
    sim = prepare(cfg).sim
    after2, _ = run_rounds(sim, 2)
    assert max_diff(ckpt["params"], after2.x) == 0.0  # the model after round 2

    resumed = serve(rc)
    assert resumed.offset == 2
    assert [h["round"] for h in resumed.history] == [1, 2, 3, 4, 5]
    assert [h["trained"] for h in resumed.history] == [h["trained"] for h in whole.history]
    assert max_diff(resumed.state.x, whole.state.x) == 0.0
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["round"] == 5 and max_diff(final["params"], whole.state.x) == 0.0
    assert json.loads((out / "evaluations.json").read_text()) == whole.evaluations
    assert torch.load(out / "checkpoint.pt", weights_only=True)["round"] == 5
    expected, _ = run_rounds(sim, cfg.rounds)
    assert max_diff(resumed.state.x, expected.x) == 0.0


def test_a_server_app_with_no_node_to_train_fails_at_once_and_keeps_its_checkpoint(one_thread, tmp_path):
    """A SuperLink restarted alone on in-memory state: Flower's SuperNodes do not register with it again, so the
    resumed ServerApp finds no node within node-wait. With min-nodes ≥ 1 it fails before its first round (one line,
    failed.json) instead of running the remaining rounds on server learning alone, whose checkpoints would make the
    out-dir look finished; the same `flwr run` with the nodes back continues from the checkpoint. A fresh run
    without nodes fails the same way, before any checkpoint."""
    from fedsl.flower.strategy import NoNodes

    rc = {**BASE, "rounds": 3, "checkpoint_every": 1, "out-dir": str(tmp_path / "out"), "min-nodes": 2,
          "algorithm.clients_per_round": 2}
    with pytest.raises(Crash):
        serve(rc, crash_at=2 + 1)  # the first train message of round 2
    with pytest.raises(NoNodes) as err:
        serve(rc, late={n: 10**9 for n in HONEST})
    line = str(err.value)
    assert line.startswith("fedsl: no SuperNode holds a partition of the run within node-wait = 0 s (min-nodes = 2)")
    assert "restart them too" in line and "continues from round 2" in line and "\n" not in line
    assert json.loads((tmp_path / "out" / "failed.json").read_text())["reason"] == line
    assert torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)["round"] == 1  # left as it was
    back = serve(rc)
    assert back.offset == 1 and all(h["trained"] for h in back.history) and len(back.history) == 3
    assert not (tmp_path / "out" / "failed.json").exists()

    fresh = {**rc, "out-dir": str(tmp_path / "fresh"), "federation": "open"}
    with pytest.raises(NoNodes, match="^fedsl: no SuperNode connected within node-wait = 0 s") as err:
        serve(fresh, late={n: 10**9 for n in HONEST})
    assert "continues from" not in str(err.value)
    written = {p.name for p in (tmp_path / "fresh").iterdir()}
    assert "failed.json" in written and not {"checkpoint.pt", "final.pt", "done.json"} & written, written


def test_a_server_app_that_loses_every_node_mid_run_checkpoints_and_fails(one_thread, tmp_path):
    """Every SuperNode gone after round 2 (min-nodes ≥ 1): round 3 waits node-wait for one, then the ServerApp fails
    in one line, having checkpointed rounds 1–2 (checkpoint_every = 3 had not yet saved them), instead of running
    rounds 3–4 on server learning alone. The same flwr run with the nodes back ends on the uninterrupted run's model.
    Losing some nodes is not this: the round goes on with the others (the partition tests above)."""
    from fedsl.flower.strategy import NoNodes

    rc = {**BASE, "rounds": 4, "checkpoint_every": 3, "out-dir": str(tmp_path), "min-nodes": 2,
          "algorithm.clients_per_round": 2}
    with pytest.raises(NoNodes) as err:
        serve(rc, gone={n: 3 for n in HONEST})  # get_node_ids is called once a round
    line = str(err.value)
    assert line.startswith("fedsl: no SuperNode holds a partition of the run within node-wait = 0 s (min-nodes = 2)")
    assert "continues from round 3" in line and "\n" not in line
    assert json.loads((tmp_path / "failed.json").read_text())["reason"] == line
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["round"] == 2 and not (tmp_path / "done.json").exists()
    assert [h["round"] for h in json.loads((tmp_path / "rounds.json").read_text())] == [1, 2]
    back = serve(rc)
    assert back.offset == 2 and [h["round"] for h in back.history] == [1, 2, 3, 4]
    assert all(h["trained"] for h in back.history) and not (tmp_path / "failed.json").exists()
    cfg, _ = parse_run_config(rc)
    expected, _ = run_rounds(prepare(cfg).sim, cfg.rounds)
    assert max_diff(back.state.x, expected.x) == 0.0


def test_a_resumed_run_whose_own_rounds_had_no_client_says_so(one_thread, tmp_path, caplog):
    """min-nodes = 0 (go on with the nodes there are, none included) after a SuperLink restarted alone: the resumed
    ServerApp's rounds find no node. The run completes (round 1 had its clients), with a warning naming the cause."""
    rc = {**BASE, "rounds": 3, "checkpoint_every": 1, "out-dir": str(tmp_path), "algorithm.clients_per_round": 2}
    with pytest.raises(Crash):
        serve(rc, crash_at=2 + 1)  # the first train message of round 2
    stranded = serve(rc, late={n: 10**9 for n in HONEST})  # no node ever connects to the new SuperLink
    assert stranded.offset == 1 and [h["trained"] for h in stranded.history][1:] == [[], []]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("no client update was aggregated in the 2 rounds since the resume at round 2" in m
               and "restart the SuperNodes too" in m for m in warned), warned
    caplog.clear()
    serve({**rc, "rounds": 4})  # the nodes are back: round 4 trains, and nothing is said
    assert not any("since the resume" in r.getMessage() for r in caplog.records)


def test_resume_refuses_another_config_and_resume_false_starts_over(one_thread, tmp_path, caplog):
    rc = {**BASE, "rounds": 2, "checkpoint_every": 1, "out-dir": str(tmp_path)}
    serve(rc)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["round"] == 2
    with pytest.raises(ConfigError) as err:
        serve({**rc, "server.gamma": 0.5})
    assert "differs in server.gamma" in str(err.value) and "\n" not in str(err.value)
    # more rounds of the same config: continues the finished run
    longer = serve({**rc, "rounds": 3})
    assert longer.offset == 2 and [h["round"] for h in longer.history] == [1, 2, 3]
    fresh = serve({**rc, "server.gamma": 0.5, "resume": False})
    assert fresh.offset == 0 and len(fresh.history) == 2
    assert any("resume = false: removed" in r.getMessage() for r in caplog.records)


def _rewrite_config(path: Path, edit) -> None:
    """The checkpoint's stored config, changed by ``edit`` (as an older or other fedsl would have written it)."""
    ckpt = checkpoint.load(path)
    edit(ckpt.extra["config"])
    checkpoint.save(path, ckpt)


def test_a_checkpoint_from_before_a_config_key_existed_resumes(one_thread, tmp_path):
    """A key added to the config since the checkpoint was written (absent there, so at its default) is no
    difference: the run resumes. A key this fedsl does not know is refused in one line."""
    rc = {**BASE, "rounds": 2, "checkpoint_every": 1, "out-dir": str(tmp_path)}
    serve(rc)
    _rewrite_config(tmp_path / "checkpoint.pt", lambda c: [c["algorithm"].pop(k) for k in
                                                            ("availability", "straggler_fraction", "straggler_mode")])
    longer = serve({**rc, "rounds": 3})
    assert longer.offset == 2 and [h["round"] for h in longer.history] == [1, 2, 3]
    _rewrite_config(tmp_path / "checkpoint.pt", lambda c: c["algorithm"].update(warp_factor=9))
    with pytest.raises(ConfigError) as err:
        serve({**rc, "rounds": 4})
    assert "holds a config this fedsl cannot read" in str(err.value) and "warp_factor" in str(err.value)
    assert "\n" not in str(err.value)


def _old_flower_layout(path: Path) -> None:
    """Rewrite the ServerApp's checkpoint as it wrote it before the one format ("fedsl-flower-checkpoint/1")."""
    ckpt = checkpoint.load(path)
    s, extra = ckpt.state, ckpt.extra
    torch.save({"format": "fedsl-flower-checkpoint/1", "round": ckpt.round, "x": s.x, "algo": s.algo,
                "gamma": s.gamma, "history": json.dumps(extra["history"]),
                "evaluations": json.dumps(extra["evaluations"]), "config": json.dumps(extra["config"])}, path)


def test_a_server_checkpoint_of_the_old_layout_resumes_bit_for_bit(one_thread, tmp_path):
    """A checkpoint written by the ServerApp before the one format (x, its records as JSON texts) still resumes,
    and the run ends with the uninterrupted run's model and records."""
    rc = {**BASE, "rounds": 4, "checkpoint_every": 2, "eval_every": 1, "algorithm.clients_per_round": 2}
    whole = serve({**rc, "out-dir": str(tmp_path / "whole")})
    out = tmp_path / "out"
    rc = {**rc, "out-dir": str(out)}
    with pytest.raises(Crash):
        serve(rc, crash_at=2 * 2 + 1)  # the first train message of round 3
    _old_flower_layout(out / "checkpoint.pt")
    assert "params" not in torch.load(out / "checkpoint.pt", weights_only=True)
    resumed = serve(rc)
    assert resumed.offset == 2 and [h["trained"] for h in resumed.history] == [h["trained"] for h in whole.history]
    assert max_diff(resumed.state.x, whole.state.x) == 0.0
    assert json.loads((out / "evaluations.json").read_text()) == whole.evaluations
    assert checkpoint.load(out / "checkpoint.pt").round == 4  # written in the one format from then on


def test_a_server_checkpoint_cut_in_half_is_one_line(one_thread, tmp_path, caplog):
    """A truncated checkpoint.pt (a full disk, a partial copy): the ServerApp fails with one line naming the file and
    what to do (it was torch's 'PytorchStreamReader failed reading zip archive' traceback); removing it starts over."""
    rc = {**BASE, "rounds": 2, "checkpoint_every": 1, "out-dir": str(tmp_path)}
    serve(rc)
    path = tmp_path / "checkpoint.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint) as err:
        serve(rc)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: the checkpoint cannot be read (")
    assert "resume = false" in msg and err.value.__cause__ is None and err.value.__suppress_context__
    assert any(r.getMessage() == f"fedsl: {msg}" for r in caplog.records)
    path.unlink()
    assert serve(rc).offset == 0
