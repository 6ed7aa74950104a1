"""An open federation (run config ``federation = "open"``, the default): clients own their data, and Flower's
stock clients (``STOCK_CLIENT``: the shape of Flower's quickstart-pytorch ClientApp, no fedsl) train FSL.

- the server samples S of the connected nodes from the seed, sends x_t and η_l, E, B, and accepts a stock
  reply (``arrays`` + ``num-examples`` + ``train_loss``); K_i is derived from what it sent;
- the aggregate is exactly the mean of the replies' models (FedAvg, η_g = 1), then server learning;
- ``num-examples`` is bounded (``max-examples``), a stale ``round`` is refused, and a rule that corrects the
  client's steps (SCAFFOLD) refuses a reply from a client that does not run it; fedsl's ClientApp does;
- what needs the server to know the clients' data is refused in one line (FedDU, DS, simulated availability,
  node-partitions), as are bad values of the new keys;
- a run in which no reply was usable fails and says so in ``out-dir/failed.json``.

The same stock ClientApp runs in real Flower processes in ``test_flower_deployment``.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.usefixtures("flower_task_identity")

from conftest import flower_rc, max_diff
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from test_flower_protocol import BASE, export_partitions, fedsl_nodes, load_plain_client, run_fedsl, serve, trains

from fedsl.config.schema import ConfigError
from fedsl.core import rng
from fedsl.flower import parse_run_config
from fedsl.flower.server import NoClientUpdate

# a SuperLink's node ids are unsigned 64-bit integers (beyond int64: no numpy int arrays of them)
NODES = [100, 101, 2**63 + 5, 2**64 - 7]

# FSL on fedsl's "mlp" in float32 (a stock client's model is float32), 4 nodes, S = 2, 3 rounds
OPEN = {**{k: v for k, v in BASE.items() if k != "dtype"}, "federation": "open", "local-epochs": 1}

# Flower's quickstart-pytorch ClientApp in shape (its message API, PyTorch, Adam, its own train/test split of
# the node's own data, its own batch size and epochs), with fedsl's "mlp" as its Net. It reads its data from
# its node config's partition-id, never from the message; it replies what the quickstart replies.
STOCK_CLIENT = '''\
"""A stock Flower ClientApp (quickstart-pytorch's shape, no fedsl)."""

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

app = ClientApp()


class Net(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 4))


def load_data(context: Context):
    """This node's own samples: 80 % to train on, 20 % to test (the quickstart's split)."""
    pid = context.node_config["partition-id"]
    data = np.load(f"{context.run_config['data-dir']}/part-{pid}.npz")
    x, y = torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long()
    cut = int(0.8 * len(x))
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def train_fn(net, data, epochs: int, lr: float) -> float:
    x, y = data
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for rows in torch.randperm(len(x)).split(32):
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(net(x[rows]), y[rows])
            loss.backward()
            optimiser.step()
            total, batches = total + loss.item(), batches + 1
    return total / batches


@app.train()
def train(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainset, _ = load_data(context)
    loss = train_fn(net, trainset, context.run_config["local-epochs"], msg.content["config"]["lr"])
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainset[0])})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, (x, y) = load_data(context)
    with torch.no_grad():
        logits = net(x)
    metrics = {"eval_loss": nn.functional.cross_entropy(logits, y).item(),
               "eval_acc": (logits.argmax(1) == y).float().mean().item(), "num-examples": len(x)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
'''


# STOCK_CLIENT on a malicious node: a node whose node config sets `sign-flip = λ` trains honestly, then sends
# x_t − λ·(x_i − x_t) (attack.kind = 'sign_flip'); other nodes run the stock client unchanged
MALICIOUS_CLIENT = STOCK_CLIENT.replace(
    '    metrics = MetricRecord({"train_loss"',
    '    flip = float(context.node_config.get("sign-flip", 0))\n'
    '    if flip:\n'
    '        x_t = msg.content["arrays"].to_torch_state_dict()\n'
    '        net.load_state_dict({n: x_t[n] - flip * (v - x_t[n]) for n, v in net.state_dict().items()})\n'
    '    metrics = MetricRecord({"train_loss"', 1)
assert MALICIOUS_CLIENT != STOCK_CLIENT

def load_stock_client(folder: Path):
    """``STOCK_CLIENT`` written to ``folder/stock_client.py`` and imported (its ClientApp)."""
    return load_plain_client(folder, STOCK_CLIENT, "stock_client")


@pytest.fixture
def stock(tmp_path):
    """(run config with data-dir, nodes 100..103 running the stock ClientApp on partitions 0..3)."""
    export_partitions(OPEN, tmp_path / "data")
    app = load_stock_client(tmp_path / "app")
    rc = {**OPEN, "data-dir": str(tmp_path / "data")}
    return rc, {NODES[i]: (app, {"partition-id": i, "num-partitions": 4}) for i in range(4)}


def test_the_stock_client_does_not_import_fedsl():
    tree = ast.parse(STOCK_CLIENT)
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "fedsl" for m in modules) and "flwr.clientapp" in modules


def test_open_is_the_default_and_replay_is_asked_for():
    assert parse_run_config({k: v for k, v in OPEN.items() if k != "federation"})[1].federation == "open"
    assert parse_run_config({**OPEN, "federation": "replay"})[1].federation == "replay"


def test_stock_clients_train_fsl_in_an_open_federation(one_thread, stock):
    """S = 2 of the 4 connected nodes each round, from the seed; the stock replies are taken as they are, K_i
    derived from what the server sent (E·⌈n_i/B⌉), and server learning runs every round."""
    rc, nodes = stock
    strategy, grid = run_fedsl(rc, nodes)
    assert [h["sampled"] for h in strategy.history] == [rng.sample_nodes(1, t, list(nodes), 2) for t in range(3)]
    assert [h["trained"] for h in strategy.history] == [h["sampled"] for h in strategy.history]
    assert all(h["rejected"] == [] and h["server_steps"] > 0 and h["train_loss"] > 0 for h in strategy.history)
    n_i = int(0.8 * 24)  # the stock client trains on its own 80 % split, and says so
    assert all(h["client_steps"] == [2 * math.ceil(n_i / 24)] * 2 for h in strategy.history)  # E = 2, B = 24 (sent)
    for msg in trains(grid):  # no partition is named: the node trains what it owns
        config = msg.content["config"]
        assert "partition-id" not in config and "num-partitions" not in config and config["lr"] == 0.05


def test_node_sampling_is_seeded_and_ignores_the_listing_order():
    nodes = [7, 3, 11, 5, 9]
    assert rng.sample_nodes(0, 4, nodes, 3) == rng.sample_nodes(0, 4, sorted(nodes, reverse=True), 3)
    assert len(rng.sample_nodes(0, 4, nodes, 3)) == 3 and set(rng.sample_nodes(0, 4, nodes, 3)) <= set(nodes)
    assert rng.sample_nodes(0, 4, nodes, 9) == sorted(nodes)  # fewer nodes than S: all of them
    draws = {tuple(rng.sample_nodes(0, t, nodes, 2)) for t in range(20)}
    assert len(draws) > 3  # a new draw each round


def _recording(replies: list):
    def tamper(msg: Message, reply: Message) -> Message:
        replies.append(reply)
        return reply
    return tamper


def test_the_aggregate_is_the_mean_of_the_stock_replies(one_thread, stock):
    """FedAvg with η_g = 1 and no server learning: x_1 is exactly the plain mean of the replied models."""
    rc, nodes = stock
    replies: list[Message] = []
    rc = flower_rc(rc, {"rounds": 1, "algorithm.name": "fedavg", "algorithm.global_lr": 1.0,
                         "algorithm.clients_per_round": 4})
    strategy, _ = run_fedsl(rc, nodes, tamper={n: _recording(replies) for n in nodes})
    assert len(replies) == 4 and strategy.history[0]["trained"] == sorted(nodes)
    models = [r.content["arrays"].to_torch_state_dict() for r in replies]
    mean = {n: torch.stack([m[n] for m in models]).mean(0) for n in models[0]}
    assert max_diff(strategy.state.x, mean) <= 1e-6


def test_weighted_aggregation_uses_the_reported_num_examples(one_thread, stock):
    """algorithm.weighted: node 101 reports 3× the samples of the others and weighs 3× as much."""
    rc, nodes = stock
    replies: dict[int, Message] = {}

    def claim(node: int, n: int):
        def tamper(msg: Message, reply: Message) -> Message:
            metrics = {**reply.content["metrics"], "num-examples": n}
            replies[node] = Message(RecordDict({"arrays": reply.content["arrays"], "metrics": MetricRecord(metrics)}),
                                    reply_to=msg)
            return replies[node]
        return tamper

    rc = flower_rc(rc, {"rounds": 1, "algorithm.name": "fedavg", "algorithm.global_lr": 1.0,
                        "algorithm.weighted": True, "algorithm.clients_per_round": 2})
    (a, b) = rng.sample_nodes(1, 0, list(nodes), 2)
    strategy, _ = run_fedsl(rc, nodes, tamper={a: claim(a, 10), b: claim(b, 30)})
    ma, mb = (replies[n].content["arrays"].to_torch_state_dict() for n in (a, b))
    assert max_diff(strategy.state.x, {n: 0.25 * ma[n] + 0.75 * mb[n] for n in ma}) <= 1e-6


def _metric(key: str, value):
    def tamper(msg: Message, reply: Message) -> Message:
        metrics = {**reply.content.metric_records["metrics"], key: value}
        return Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                   "metrics": MetricRecord(metrics)}), reply_to=msg)
    return tamper


def _without(key: str):
    def tamper(msg: Message, reply: Message) -> Message:
        metrics = {k: v for k, v in reply.content.metric_records["metrics"].items() if k != key}
        return Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                   "metrics": MetricRecord(metrics)}), reply_to=msg)
    return tamper


def _float64(msg: Message, reply: Message) -> Message:
    arrays = {k: torch.from_numpy(v.numpy().astype(np.float64))
              for k, v in reply.content.array_records["arrays"].items()}
    return Message(RecordDict({"arrays": ArrayRecord(torch_state_dict=arrays),
                               "metrics": reply.content.metric_records["metrics"]}), reply_to=msg)


@pytest.mark.parametrize("tamper, needle", [
    (_metric("num-examples", 2_000_000), "num-examples = 2000000: expected an integer in 1..1000000 (run config "
                                         "max-examples)"),
    (_metric("num-examples", 0), "num-examples = 0: expected an integer in 1..1000000"),
    (_metric("num-examples", 19.0), "num-examples = 19.0: expected an integer"),
    (_without("num-examples"), "metric num-examples missing"),
    (_metric("round", 0), "round = 0: expected 1 (a stale or replayed reply)"),
    (_metric("steps", 0), "metric steps = 0: expected an integer >= 1"),
    (_metric("train_loss", float("inf")), "metric train_loss = inf: expected a finite number"),
    (_float64, "dtype float64: expected float32"),
])
def test_a_bad_stock_reply_is_refused_in_one_line(one_thread, stock, caplog, tamper, needle):
    """Round 2 (t = 1): node 101's reply is bad; the round goes on with the others, and 101 stays in the run."""
    rc, nodes = stock
    bad = {101: lambda msg, reply: tamper(msg, reply) if msg.content["config"]["round"] == 1 else reply}
    rc = {**rc, "algorithm.clients_per_round": 4}
    strategy, _ = run_fedsl(rc, nodes, tamper=bad)
    others = [n for n in NODES if n != 101]
    assert [h["trained"] for h in strategy.history] == [NODES, others, NODES]
    lines = [r.getMessage() for r in caplog.records if "dropped the reply of node 101:" in r.getMessage()]
    assert len(lines) == 1 and needle in lines[0] and "\n" not in lines[0], lines


def test_max_examples_is_configurable(one_thread, stock, caplog):
    rc, nodes = stock
    strategy, _ = run_fedsl({**rc, "rounds": 1, "max-examples": 10, "algorithm.clients_per_round": 4}, nodes)
    assert strategy.history[0]["trained"] == [] and len(strategy.history[0]["rejected"]) == 4
    assert "num-examples = 19: expected an integer in 1..10 (run config max-examples)" in caplog.text


@pytest.mark.parametrize("name", ["scaffold", "fedclg_c"])
def test_a_rule_that_corrects_the_clients_needs_a_client_that_runs_it(one_thread, stock, caplog, name):
    """SCAFFOLD, and FedCLG-C (whose clients measure their own ∇F_i(x_t) on the data they own and read ∇f0(x_t) from
    the train message's server-state): a stock client's plain-SGD reply has no 'steps' and is refused; fedsl's
    ClientApp, in an open federation, runs the rule's client half on the data it owns and is accepted."""
    rc, nodes = stock
    strategy, _ = run_fedsl(flower_rc(rc, {"rounds": 1, "algorithm.name": name}), nodes)
    assert strategy.history[0]["trained"] == []
    assert f"algorithm {name!r} corrects the clients' local steps, and this reply has no 'steps' metric" in caplog.text
    fedsl_rc = flower_rc(BASE, {"federation": "open", "rounds": 2, "algorithm.name": name})
    strategy, grid = run_fedsl(fedsl_rc, fedsl_nodes(4))
    assert all(len(h["trained"]) == 2 and h["rejected"] == [] for h in strategy.history)
    assert all(h["client_steps"] == [2 * math.ceil(24 / 24)] * 2 for h in strategy.history)  # the clients' own K_i
    if name == "fedclg_c":
        assert all(h["server_steps"] > 0 for h in strategy.history)
        sent = [m for m in grid.sent if m.metadata.message_type == "train"]
        assert sent and all("server-state" in m.content.array_records for m in sent)  # g_s = ∇f0(x_t) goes down


@pytest.mark.parametrize("extra, needle", [
    ({"algorithm.name": "feddu"}, "algorithm.name = 'feddu' reads the sampled clients' label counts"),
    ({"algorithm.name": "ds"}, "algorithm.name = 'ds' trains the clients on D_i ∪ D0"),
    ({"algorithm.name": "qfedavg"}, "algorithm.name = 'qfedavg' reads each client's F_i(x_t), the client's mean loss "
                                    "on its data at the model it received (start-loss) beside x_i"),
    ({"algorithm.name": "fedclg_s"}, "algorithm.name = 'fedclg_s' reads each client's ∇F_i(x_t), the gradient of the "
                                     "client's mean loss over all of its data at the model it received (start-grad)"),
    ({"algorithm.availability": 0.5}, "algorithm.availability = 0.5 and algorithm.straggler_fraction = 0.0 simulate"),
    ({"algorithm.straggler_fraction": 0.2}, "algorithm.straggler_fraction = 0.2 simulate partial participation"),
    ({"node-partitions": "100:0"}, "run config node-partitions assigns partitions, but in an open federation"),
    ({"federation": "closed"}, "run config federation = 'closed': expected one of open, replay"),
    ({"max-examples": 0}, "run config max-examples = 0: expected an integer >= 1"),
])
def test_what_an_open_federation_cannot_run_is_one_line(extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_run_config(flower_rc(OPEN, extra))
    assert needle in str(err.value) and "\n" not in str(err.value)
    if "federation" not in extra and "max-examples" not in extra:
        assert 'set the run config key federation = "replay"' in str(err.value)
        parse_run_config(flower_rc(OPEN, extra, {"federation": "replay"}))  # what replay can run


def test_a_failed_open_run_says_so_in_failed_json(one_thread, stock, tmp_path):
    """Every stock client fails (its data folder is missing): NoClientUpdate, and out-dir/failed.json has the
    reason, since `flwr run` exits 0 whatever the ServerApp did."""
    rc, nodes = stock
    out = tmp_path / "out"
    with pytest.raises(NoClientUpdate):
        serve({**rc, "data-dir": str(tmp_path / "nowhere"), "out-dir": str(out)}, nodes)
    failed = json.loads((out / "failed.json").read_text())
    assert failed["status"] == "failed" and "no client update was aggregated in any of the 3 rounds" in failed["reason"]
    assert not (out / "done.json").exists()
    serve({**rc, "out-dir": str(out), "resume": False}, nodes)  # the same out-dir, now a run that completes
    assert json.loads((out / "done.json").read_text())["federation"] == "open" and not (out / "failed.json").exists()


def test_the_open_run_is_deterministic_given_the_nodes(one_thread, stock):
    """The same nodes and seed: the same sampled nodes (the stock client's own shuffles make the models differ)."""
    rc, nodes = stock
    a, _ = run_fedsl({**rc, "rounds": 2}, nodes)
    b, _ = run_fedsl({**rc, "rounds": 2}, dict(reversed(list(nodes.items()))))
    assert [h["sampled"] for h in a.history] == [h["sampled"] for h in b.history]



def _sign_flip(replies: list, scale: float = 10.0):
    """A malicious node: it trains honestly, then sends x_t − λ·(x_i − x_t) (attack.kind = 'sign_flip', λ = 10)."""
    def tamper(msg: Message, reply: Message) -> Message:
        x_t = msg.content["arrays"].to_torch_state_dict()
        x_i = reply.content["arrays"].to_torch_state_dict()
        bad = {n: x_t[n] - scale * (x_i[n] - x_t[n]) for n in x_t}
        out = Message(RecordDict({"arrays": ArrayRecord(torch_state_dict=bad),
                                  "metrics": reply.content["metrics"]}), reply_to=msg)
        replies.append(out)
        return out
    return tamper


def test_a_malicious_client_app_against_a_robust_rule_on_flower(one_thread, stock):
    """One of 4 nodes flips and scales its update. FedAvg (η_g = 1, no server learning) averages it in: its model is
    the mean of the 4 replies. With robust.aggregator = 'median' the model is their coordinate-wise median, and
    stays next to the honest nodes' mean, at most half as far from it as FedAvg's."""
    rc, nodes = stock
    gaps = {}
    for aggregator in ("mean", "median"):
        replies: list[Message] = []
        honest = {n: _recording(replies) for n in NODES[:3]}
        run = flower_rc(rc, {"rounds": 1, "algorithm.name": "fedavg", "algorithm.global_lr": 1.0,
                             "algorithm.clients_per_round": 4, "robust.aggregator": aggregator})
        strategy, _ = run_fedsl(run, nodes, tamper={**honest, NODES[3]: _sign_flip(replies)})
        assert strategy.history[0]["trained"] == NODES and len(replies) == 4
        models = [r.content["arrays"].to_torch_state_dict() for r in replies]
        stacked = {n: torch.stack([m[n] for m in models]) for n in models[0]}
        if aggregator == "median":  # of an even count: the midpoint of the two middle values
            expected = {n: v.sort(0).values[1:3].mean(0) for n, v in stacked.items()}
        else:
            expected = {n: v.mean(0) for n, v in stacked.items()}
        assert max_diff(strategy.state.x, expected) <= 1e-6
        gaps[aggregator] = max_diff(strategy.state.x, {n: v[:3].mean(0) for n, v in stacked.items()})
    print(f"max |x_1 - honest mean|: {gaps}")
    assert gaps["median"] < 0.5 * gaps["mean"], gaps
