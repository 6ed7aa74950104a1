"""The Flower protocol (docs/reference/flower-protocol.md), spoken by code that is not fedsl's, in one process.

- the train message carries what a plain client needs (round, partition, η_l, E, B, K, the rule's
  keys and server state);
- a plain Flower ClientApp that does not import fedsl (``PLAIN_CLIENT``: Flower's documented API and
  PyTorch, fedsl's ``mlp`` re-declared) trains under ``FedslStrategy`` with FSL's server learning, is
  assigned a partition by the server (it has no ``query`` handler), and gives the simulator's model;
- its bad replies are refused in one line naming the node and the key;
- fedsl's ClientApp runs under Flower's stock ``FedAvg`` / ``FedAvgM`` with a run config of a few
  data keys, takes η_l etc. from the message, reports its train loss and evaluates;
- users' own run-config keys pass; a run in which no client update was aggregated fails.

The same plain ClientApp runs in real Flower processes in ``test_flower_deployment``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.usefixtures("flower_task_identity")

from conftest import FLOWER_RUN, max_diff, run_rounds
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fedsl.config.schema import ConfigError
from fedsl.flower import FedslStrategy, load_setup, make_client_app, parse_run_config, train_partition
from fedsl.flower.records import to_record
from fedsl.flower.server import NoClientUpdate, run_server
from fedsl.runs.build import prepare

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"

# FSL in float64 on fedsl's "mlp"; B = n_i, so that a client's local steps are full-batch
# gradient steps, which any correct client computes (up to float rounding) whatever its batch order
BASE = {**FLOWER_RUN, "algorithm.batch_size": 24, "algorithm.local_epochs": 2, "server.batch_size": 12,
        "node-wait": 0.0}

# A plain Flower ClientApp: Flower's documented message API and PyTorch, no fedsl. It trains the partition
# the train message names (loaded from the folder of its own run-config key ``data-dir``) with local SGD.
PLAIN_CLIENT = '''\
"""A plain Flower ClientApp (no fedsl): local SGD in PyTorch on fedsl's "mlp" architecture."""

import math

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

app = ClientApp()


def mlp(in_features: int, num_classes: int) -> nn.Module:
    """fedsl's "mlp": parameter names 1.weight, 1.bias, 3.weight, 3.bias (the nn.Sequential's state dict)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 64), nn.ReLU(), nn.Linear(64, num_classes))


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    state = msg.content["arrays"].to_torch_state_dict()
    pid = config["partition-id"]
    data = np.load(f"{context.run_config['data-dir']}/part-{pid}.npz")
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    model = mlp(state["1.weight"].shape[1], state["3.weight"].shape[0]).to(state["1.weight"].dtype)
    model.load_state_dict(state)
    optimiser = torch.optim.SGD(model.parameters(), lr=config["lr"])
    n, batch = len(x), config["batch-size"]
    steps = config["local-steps"] if "local-steps" in config else config["local-epochs"] * math.ceil(n / batch)
    generator = torch.Generator().manual_seed(1000 * config["round"] + pid)
    losses = []
    while len(losses) < steps:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch):
            if len(losses) == steps:
                break
            rows = order[start:start + batch]
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
    metrics = MetricRecord({"num-examples": n, "steps": steps, "partition-id": pid, "round": config["round"],
                            "train-loss": sum(losses) / steps})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
'''


def load_plain_client(folder: Path, source: str = PLAIN_CLIENT, stem: str = "plain_client"):
    """``source`` (``PLAIN_CLIENT``) written to ``folder/STEM.py`` and imported (its ClientApp)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{stem}_{abs(hash(str(folder)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


def export_partitions(run_config: dict, folder: Path, app_dir: Path | None = None) -> None:
    """Each client's partition D_i as ``folder/part-I.npz`` (x, y): the data a plain client holds."""
    cfg, _ = parse_run_config(run_config, app_dir)
    sim = prepare(cfg).sim
    folder.mkdir(parents=True, exist_ok=True)
    for i, idx in enumerate(sim.client_data):
        rows = torch.as_tensor(idx, dtype=torch.long, device=sim.fed.x.device)
        np.savez(folder / f"part-{i}.npz", x=sim.fed.x[rows].cpu().numpy(), y=sim.fed.y[rows].cpu().numpy())


def write_plain_app(folder: Path, config: dict, client: str = PLAIN_CLIENT) -> Path:
    """A Flower App folder: fedsl's ServerApp, ``client`` (``PLAIN_CLIENT``) as the ClientApp, ``config`` as its
    run config."""
    package = folder / "plain_app"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "client_app.py").write_text(client)
    (package / "server_app.py").write_text("from fedsl.flower import make_server_app\n\napp = make_server_app()\n")

    def toml(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(value) if isinstance(value, str) else repr(value)

    lines = ["[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "", "[project]",
             'name = "plain-app"', 'version = "1.0.0"', 'license = "MIT"', "dependencies = []", "",
             "[tool.hatch.build.targets.wheel]", 'packages = ["plain_app"]', "", "[tool.flwr.app]",
             'publisher = "test"', "", "[tool.flwr.app.components]", 'serverapp = "plain_app.server_app:app"',
             'clientapp = "plain_app.client_app:app"', "", "[tool.flwr.app.config]"]
    lines += [f"{k} = {toml(v)}" for k, v in config.items()]  # dotted keys: TOML's nested tables
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return folder


class Grid:
    """ClientApps in this process behind Flower's Grid; each node runs its own app (fedsl's or a plain one)
    with its own Context. Exceptions come back as error replies, as a SuperNode sends them.

    Args:
        nodes: node id -> (ClientApp, node config).
        tamper: node id -> f(train message, reply) -> what the node sends instead.
        fail_rounds: train messages of these rounds (0-based ``round`` or ``server-round`` - 1) fail.
    """

    def __init__(self, run_config: dict, nodes: dict[int, tuple[object, dict]], tamper=None,
                 fail_rounds=()) -> None:
        self.apps = {node: app for node, (app, _) in nodes.items()}
        self.contexts = {node: Context(run_id=1, node_id=node, node_config=nc, state=RecordDict(),
                                       run_config=run_config) for node, (_, nc) in nodes.items()}
        self.tamper, self.fail_rounds = tamper or {}, set(fail_rounds)
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.apps)

    def _reply(self, msg: Message) -> Message:
        msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
        self.sent.append(msg)
        node = msg.metadata.dst_node_id
        try:
            if msg.metadata.message_type == "train":
                config = msg.content.config_records.get("config") or {}  # SecAgg+'s stages carry none
                if config.get("round", config.get("server-round", 0) - 1) in self.fail_rounds:
                    raise RuntimeError("this node fails in this round")
            reply = self.apps[node](msg, self.contexts[node])
        except Exception as e:  # noqa: BLE001 - what a SuperNode sends back when the ClientApp raises
            return Message(Error(code=1, reason=f"{type(e)}:<'{e}'>"), reply_to=msg)
        if msg.metadata.message_type == "train" and node in self.tamper:
            reply = self.tamper[node](msg, reply)
        return reply

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        return [self._reply(m) for m in messages]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for m in messages:
            reply = self._reply(m)
            self._replies[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, ids) -> list[Message]:
        return [self._replies.pop(i) for i in list(ids) if i in self._replies]


def fedsl_nodes(n: int) -> dict[int, tuple[object, dict]]:
    app = make_client_app(APP)
    return {100 + i: (app, {"partition-id": i}) for i in range(n)}


@pytest.fixture
def plain(tmp_path):
    """(run config with data-dir, nodes 100..103 running the plain ClientApp)."""
    export_partitions(BASE, tmp_path / "data")
    app = load_plain_client(tmp_path / "app")
    return {**BASE, "data-dir": str(tmp_path / "data")}, {100 + i: (app, {}) for i in range(4)}


def run_fedsl(run_config: dict, nodes: dict, **grid_kw) -> tuple[FedslStrategy, Grid]:
    setup = load_setup(run_config)
    grid = Grid(run_config, nodes, **grid_kw)
    strategy = FedslStrategy(setup)
    strategy.start(grid, to_record(strategy.state.x), num_rounds=setup.cfg.rounds, timeout=5.0)
    return strategy, grid


def trains(grid: Grid) -> list[Message]:
    return [m for m in grid.sent if m.metadata.message_type == "train"]


# ----------------------------------------------------------------------------- the train message

def test_the_train_message_carries_what_a_plain_client_needs(one_thread):
    rc = {**BASE, "rounds": 2, "algorithm.local_steps": 3}
    strategy, grid = run_fedsl(rc, fedsl_nodes(4))
    sent = trains(grid)
    assert len(sent) == 2 * 2
    for msg in sent:
        config = dict(msg.content.config_records["config"])
        t = config["round"]
        assert config["server-round"] == t + 1 and config["num-partitions"] == 4 and config["algorithm"] == "fsl"
        assert config["lr"] == 0.05 and config["local-epochs"] == 2 and config["batch-size"] == 24
        assert config["local-steps"] == 3
        node = msg.metadata.dst_node_id
        assert config["partition-id"] == grid.contexts[node].node_config["partition-id"]
        assert sorted(msg.content.array_records["arrays"]) == sorted(strategy.sim.fm.names)
        assert "server-state" not in msg.content.array_records
    assert "local-steps" not in trains(run_fedsl({**BASE, "rounds": 1}, fedsl_nodes(4))[1])[0].content["config"]


def test_rule_specific_keys_and_arrays(one_thread):
    """FedProx sends μ under Flower's own key; SCAFFOLD sends c as arrays named c/<parameter>."""
    plain = {k: v for k, v in BASE.items() if k != "server.batch_size"}  # FedProx, SCAFFOLD: no server learning
    _, grid = run_fedsl({**plain, "rounds": 1, "algorithm.name": "fedprox", "algorithm.mu": 0.3}, fedsl_nodes(4))
    assert trains(grid)[0].content["config"]["proximal-mu"] == 0.3
    strategy, grid = run_fedsl({**plain, "rounds": 1, "algorithm.name": "scaffold"}, fedsl_nodes(4))
    state = trains(grid)[0].content.array_records["server-state"]
    assert sorted(state) == sorted(f"c/{n}" for n in strategy.sim.fm.names)


# ----------------------------------------------------------------------------- a plain Flower client

def test_the_plain_client_does_not_import_fedsl():
    tree = ast.parse(PLAIN_CLIENT)
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "fedsl" for m in modules) and "flwr.clientapp" in modules


def test_a_plain_flower_client_app_trains_under_fedsl_strategy_with_server_learning(one_thread, plain, caplog):
    """Four nodes run the plain ClientApp (no query handler): the server assigns them partitions 0..3 in
    node-id order, they train the simulator's sampled clients with the message's η_l, E and B, and the run
    gives the simulator's model (full-batch steps, float64) with K0 server steps every round."""
    rc, nodes = plain
    strategy, grid = run_fedsl(rc, nodes)
    cfg, _ = parse_run_config(BASE)
    expected, infos = run_rounds(prepare(cfg).sim, cfg.rounds)
    assert strategy.node_partition == {100: 0, 101: 1, 102: 2, 103: 3} and not strategy.dropped
    assert any("node 101 has no query handler: the server assigns it partition 1" in r.getMessage()
               for r in caplog.records)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert all(h["server_steps"] == i.server_steps > 0 for h, i in zip(strategy.history, infos))
    assert all(h["client_steps"] == [2, 2] and h["rejected"] == [] for h in strategy.history)
    assert all(h["train_loss"] > 0 for h in strategy.history)
    assert max_diff(strategy.state.x, expected.x) <= 1e-10


def test_plain_clients_with_node_partitions(one_thread, plain):
    """node-partitions pins plain nodes to partitions; an unlisted plain node is left out."""
    rc, nodes = plain
    rc = {**rc, "node-partitions": "100:3, 101:2, 102:1, 103:0"}
    strategy, _ = run_fedsl(rc, {**nodes, 99: nodes[100]})
    assert strategy.node_partition == {100: 3, 101: 2, 102: 1, 103: 0} and 99 in strategy.dropped
    assert all(len(h["trained"]) == 2 for h in strategy.history)


def _without(key: str):
    def tamper(msg: Message, reply: Message) -> Message:
        metrics = {k: v for k, v in reply.content.metric_records["metrics"].items() if k != key}
        return Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                   "metrics": MetricRecord(metrics)}), reply_to=msg)
    return tamper


def _metric(key: str, value):
    def tamper(msg: Message, reply: Message) -> Message:
        metrics = {**reply.content.metric_records["metrics"], key: value}
        return Message(RecordDict({"arrays": reply.content.array_records["arrays"],
                                   "metrics": MetricRecord(metrics)}), reply_to=msg)
    return tamper


def _renamed(msg: Message, reply: Message) -> Message:
    arrays = reply.content.array_records["arrays"]
    return Message(RecordDict({"arrays": ArrayRecord({f"net.{k}": v for k, v in arrays.items()}),
                               "metrics": reply.content.metric_records["metrics"]}), reply_to=msg)


@pytest.mark.parametrize("tamper, needle", [
    (_without("round"), "metric round missing"),
    (_without("steps"), "metric steps missing"),
    (_without("partition-id"), "metric partition-id missing"),
    (_without("num-examples"), "metric num-examples missing"),
    (_metric("round", 1.0), "round = 1.0: expected an integer"),
    (_metric("train-loss", [0.5, 0.4]), "train-loss = [0.5, 0.4]: expected a finite number"),
    (_metric("train-loss", float("nan")), "train-loss = nan: expected a finite number"),
    (_renamed, "arrays do not match the model's parameters: missing ['1.bias'"),
])
def test_a_plain_clients_bad_reply_is_refused_in_one_line_naming_node_and_key(one_thread, plain, caplog, tamper,
                                                                             needle):
    rc, nodes = plain
    strategy, _ = run_fedsl({**rc, "rounds": 1, "algorithm.clients_per_round": 4}, nodes, tamper={101: tamper})
    assert strategy.history[0]["trained"] == [0, 2, 3]
    lines = [r.getMessage() for r in caplog.records if "dropped the reply of node 101 (partition 1)" in r.getMessage()]
    assert len(lines) == 1 and needle in lines[0] and "\n" not in lines[0], lines


# ----------------------------------------------------------------------------- a run with no client update

def serve(run_config: dict, nodes: dict, **grid_kw) -> FedslStrategy:
    return run_server(Grid(run_config, nodes, **grid_kw),
                      Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))


def test_a_run_in_which_no_client_update_was_aggregated_fails(one_thread, plain, tmp_path):
    """Every plain client fails (its data folder is missing): the ServerApp raises one line, no final.pt."""
    rc, nodes = plain
    out = tmp_path / "out"
    with pytest.raises(NoClientUpdate) as err:
        serve({**rc, "data-dir": str(tmp_path / "nowhere"), "out-dir": str(out)}, nodes)
    assert "no client update was aggregated in any of the 3 rounds" in str(err.value) and "\n" not in str(err.value)
    assert not (out / "final.pt").exists() and not (out / "done.json").exists()
    assert len(json.loads((out / "rounds.json").read_text())) == 3


def test_a_single_round_without_client_update_is_a_warning(one_thread, caplog, tmp_path):
    """Round 1 fails on every node, rounds 2 and 3 train: the run completes."""
    rc = {**BASE, "out-dir": str(tmp_path)}
    strategy = serve(rc, fedsl_nodes(4), fail_rounds={0})
    assert [bool(h["trained"]) for h in strategy.history] == [False, True, True]
    assert (tmp_path / "done.json").exists()


# ----------------------------------------------------------------------------- fedsl's ClientApp, stock strategies

# all a fedsl ClientApp needs from the run config: the federation it holds a partition of (and the model)
MINIMAL = {"seed": 1, "dtype": "float64", "data.dataset": "synthetic_chars", "data.chars": "0123",
           "data.train_per_class": 60, "data.test_per_class": 10, "data.num_clients": 3,
           "data.classes_per_client": 2, "data.samples_per_client": 60, "model.name": "mlp",
           "num-server-rounds": 2, "my-own-key": "anything"}


def test_the_client_app_takes_lr_epochs_batch_and_steps_from_the_message(one_thread):
    app = make_client_app()
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 1}, state=RecordDict(), run_config=MINIMAL)
    setup = load_setup(MINIMAL, client=True)
    sim = setup.sim
    x0 = sim.initial_params()
    config = {"server-round": 3, "lr": 0.2, "batch-size": 5, "local-steps": 3}
    reply = app(Message(RecordDict({"arrays": to_record(x0), "config": ConfigRecord(config)}),
                        dst_node_id=7, message_type="train"), ctx)
    metrics = reply.content.metric_records["metrics"]
    assert metrics["round"] == 2 and metrics["steps"] == 3 and metrics["partition-id"] == 1
    assert metrics["num-examples"] == 60 and metrics["train-loss"] > 0
    local = replace(sim.alg.local, lr=0.2, batch_size=5, steps=3)
    expected, _, _ = train_partition(sim, x0, 2, 1, local=local)
    got = {n: torch.from_numpy(a.numpy()) for n, a in reply.content.array_records["arrays"].items()}
    assert max_diff(got, expected) == 0.0
    without, _, _ = train_partition(sim, x0, 2, 1)  # the config's η_l, B, E: another model
    assert max_diff(got, without) > 1e-6
    with pytest.raises(ValueError, match="lr = -1.0: expected a number > 0"):
        app(Message(RecordDict({"arrays": to_record(x0), "config": ConfigRecord({"server-round": 1, "lr": -1.0})}),
                    dst_node_id=7, message_type="train"), ctx)
    with pytest.raises(ValueError, match="neither round nor server-round"):
        app(Message(RecordDict({"arrays": to_record(x0), "config": ConfigRecord({})}), dst_node_id=7,
                    message_type="train"), ctx)


@pytest.mark.parametrize("strategy_cls", [FedAvg, FedAvgM])
def test_fedsl_client_app_under_flowers_stock_strategies(one_thread, strategy_cls):
    """Flower's FedAvg / FedAvgM (no fedsl key in their messages; lr in the train config) drive fedsl's
    ClientApp for 2 rounds with train and evaluate messages; the run config holds only data keys."""
    strategy = strategy_cls(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=3, min_train_nodes=3,
                            min_evaluate_nodes=3)
    grid = Grid(MINIMAL, fedsl_nodes(3))
    sim = load_setup(MINIMAL, client=True).sim
    x0 = sim.initial_params()
    result = strategy.start(grid, to_record(x0), num_rounds=2, timeout=5.0, train_config=ConfigRecord({"lr": 0.1}))
    assert sorted(result.train_metrics_clientapp) == [1, 2] and sorted(result.evaluate_metrics_clientapp) == [1, 2]
    for metrics in result.train_metrics_clientapp.values():
        assert metrics["train-loss"] > 0
    for metrics in result.evaluate_metrics_clientapp.values():
        assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0
    if strategy_cls is FedAvg:  # round 1: the n_i-weighted mean of the three clients' updates with η_l = 0.1
        local = replace(sim.alg.local, lr=0.1)
        finals = [train_partition(sim, x0, 0, i, local=local)[0] for i in range(3)]
        sizes = [len(sim.client_data[i]) for i in range(3)]
        first = [m for m in grid.sent if m.metadata.message_type == "evaluate"][0]
        got = {n: torch.from_numpy(a.numpy()) for n, a in first.content.array_records["arrays"].items()}
        mean = {n: sum(s * f[n] for s, f in zip(sizes, finals)) / sum(sizes) for n in x0}
        assert max_diff(got, mean) <= 1e-12


# ----------------------------------------------------------------------------- the run config

def test_users_own_run_config_keys_pass_and_near_misses_are_refused():
    cfg, options = parse_run_config({**BASE, "data-dir": "/data", "num-server-rounds": 3, "my.section.key": 1})
    assert options.user_keys == ("data-dir", "my.section.key", "num-server-rounds") and cfg.rounds == 3
    for key, needle in (("rouds", "did you mean 'rounds'"), ("eval-every", "did you mean 'eval_every'"),
                        ("algorithm.lr", "algorithm.lr"), ("round-timeot", "did you mean 'round-timeout'")):
        with pytest.raises(ConfigError) as err:
            parse_run_config({**BASE, key: 1})
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_client_takes_the_local_step_hyper_parameters_from_the_message():
    """proximal-mu (Flower's FedProx key), alpha and rho: the spec's local keys, set by the strategy."""
    from conftest import random_federation

    from fedsl.algorithms import LocalTraining, make_algorithm
    from fedsl.engine.executors import SequentialExecutor
    from fedsl.engine.functional import FunctionalModel
    from fedsl.engine.simulator import Simulator
    from fedsl.flower.client import message_algorithm, train_partition
    from fedsl.models import build_model
    fed = random_federation([12, 20, 16], n0=8, dtype=torch.float64)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).to(torch.float64))
    local = LocalTraining(0.1, 8)
    sim = Simulator(fm, fed, make_algorithm("fedprox", local, 1.0, None, mu=0.5), SequentialExecutor(fm), 2, seed=1)
    x = sim.initial_state().x
    own, _, _ = train_partition(sim, x, 0, 1)
    zero, _, _ = train_partition(sim, x, 0, 1, alg=message_algorithm(sim.alg, {"proximal-mu": 0.0}))
    plain, _, _ = train_partition(sim, x, 0, 1, alg=make_algorithm("fedavg", local, 1.0, None))
    assert all(torch.equal(zero[n], plain[n]) for n in x)  # μ = 0 from the message: FedAvg's client exactly
    assert not all(torch.equal(own[n], plain[n]) for n in x)
    assert message_algorithm(sim.alg, {"proximal-mu": 0.5}) is sim.alg  # unchanged: the same object
    nova = make_algorithm("fednova", local, 1.0, None)
    assert message_algorithm(nova, {"rho": 0.5}).rule.rho == 0.5
    with pytest.raises(ValueError, match=r"^train message config proximal-mu = -1: expected a number >= 0$"):
        message_algorithm(sim.alg, {"proximal-mu": -1})


def test_num_server_rounds_stands_for_rounds():
    """Flower's templates name T num-server-rounds: it sets rounds when the run config has none."""
    without = {k: v for k, v in BASE.items() if k != "rounds"}
    cfg, _ = parse_run_config({**without, "num-server-rounds": 7})
    assert cfg.rounds == 7
    cfg, _ = parse_run_config({**BASE, "num-server-rounds": 3})  # equal to rounds: fine
    assert cfg.rounds == 3
    with pytest.raises(ConfigError, match=r"^run config num-server-rounds = 5 and rounds = 3: expected one"):
        parse_run_config({**BASE, "num-server-rounds": 5})
