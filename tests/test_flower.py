"""fedsl.flower in one process: the strategy and the ClientApp talk through a loopback Grid that
calls the ClientApp directly (the deployment tests run the same code in real Flower processes).

The runs are compared with the simulator on the same config: same sampled clients, same model
(float64: to 1e-10, or exactly where no glue is involved), per-client state in the ClientApp's
context, and bad configs refused with one line naming the value.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")
pytestmark = pytest.mark.usefixtures("flower_task_identity")

from conftest import FLOWER_RUN, max_diff, run_rounds
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.config import flatten_dict

from fedsl.config.schema import ConfigError
from fedsl.flower import (
    FedslStrategy,
    load_setup,
    make_client_app,
    parse_run_config,
    partition_id,
)
from fedsl.flower.grid import RoundGrid
from fedsl.flower.records import to_record
from fedsl.runs.build import prepare

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"

BASE = FLOWER_RUN  # the simulator's run over the network, to compare with


class LoopGrid:
    """A Grid whose nodes are ClientApp calls in this process, one Context (and state) per node."""

    def __init__(self, run_config: dict, partitions: dict[int, object], fail: set[int] = frozenset()) -> None:
        self.app = make_client_app(APP)
        self.contexts = {node: Context(run_id=1, node_id=node, node_config={"partition-id": pid}, state=RecordDict(),
                                       run_config=run_config) for node, pid in partitions.items()}
        self.fail = set(fail)  # nodes that crash when asked to train
        self.sent: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"{len(self.sent)}-{i}"
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if node in self.fail and msg.metadata.message_type == "train":
                continue  # a crashed node: no reply
            try:
                replies.append(self.app(msg, self.contexts[node]))
            except Exception as e:  # noqa: BLE001 - what a SuperNode sends back when the ClientApp raises
                replies.append(Message(Error(code=1, reason=str(e)), reply_to=msg))
        return replies


def run_flower(run_config: dict, partitions: dict[int, object] | None = None, fail=frozenset()):
    setup = load_setup(run_config)
    grid = LoopGrid(run_config, partitions or {100 + i: i for i in range(setup.num_clients)}, fail)
    strategy = FedslStrategy(setup)
    strategy.start(grid, to_record(strategy.state.x), num_rounds=setup.cfg.rounds, timeout=5.0)
    return strategy, grid


def run_simulator(run_config: dict):
    cfg, _ = parse_run_config(run_config)
    return run_rounds(prepare(cfg).sim, cfg.rounds)


# ----------------------------------------------------------------------------- parity with the simulator

def test_fsl_is_bit_identical_to_the_simulator(one_thread):
    """FSL on the paper's conv net shape: x_T bit for bit, the simulator's clients, K0 server steps."""
    rc = {**BASE, "model.name": "small_cnn", "dtype": "float32", "rounds": 4}
    strategy, grid = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert [h["server_steps"] for h in strategy.history] == [i.server_steps for i in infos]
    assert all(h["server_steps"] > 0 for h in strategy.history)
    assert max_diff(strategy.state.x, expected.x) == 0.0
    # one message per sampled client and round (+ the initial partition-id queries)
    assert sum(m.metadata.message_type == "train" for m in grid.sent) == 4 * 2


@pytest.mark.parametrize("name, extra", [
    ("scaffold", {"server.learning": "incremental"}),  # SCAFFOLD + SL: c_i on the clients, c on the server
    ("feddyn", {"server.learning": "incremental"}),  # FedDyn + SL: ∇L_i on the clients, h on the server
    ("fsl_p", {}),  # the server as one more client
    ("fedavgm", {"server.learning": "incremental"}),  # server momentum kept by the strategy
    ("fedyogi", {"server.learning": "incremental"}),  # Yogi's m, v kept by the strategy, then line 10
    ("fedadagrad", {"server.learning": "parallel"}),  # Adagrad's Σ Δ_t² on the mean with FSL-p's server row
    ("qfedavg", {"server.learning": "incremental"}),  # each client's F_i(x_t) as its start-loss metric, then line 10
    ("ds", {}),  # clients train on D_i ∪ D0
    ("fsl", {"data.partition": "dirichlet", "data.dirichlet_alpha": 0.5}),  # unequal n_i: plain mean of Δ_i
    ("fsl", {"data.partition": "dirichlet", "data.dirichlet_alpha": 0.5, "algorithm.weighted": True}),
    ("feddu", {}),  # γ_t from the replies' partitions, x̄_t's accuracy on D0
    ("d0_only", {}),  # the clients' updates dropped, line 10 alone
    ("fedclg_c", {}),  # ∇f0(x_t) sent in server-state, each client's ∇F_i(x_t) measured on the node, then line 10
    ("fedclg_s", {}),  # each client's ∇F_i(x_t) in the reply's ArrayRecord start-grad, ∇f0(x_t) on the server
    ("feddum", {}),  # FedDU's γ_t, the global momentum M kept by the strategy
    # FedDF + SL: the clients' models distilled into their mean on D0's images (early stopping), then line 10
    ("feddf", {"server.learning": "incremental", "distill.steps": 6, "distill.batch_size": 4, "distill.eval_every": 2,
               "distill.patience": 2, "distill.val_fraction": 0.25}),
])
def test_algorithms_on_flower_match_the_simulator(one_thread, name, extra):
    rc = {**BASE, "algorithm.name": name, "rounds": 4, **extra}
    strategy, grid = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    # the same client and server functions as the simulator's, on the same inputs: bit for bit
    assert max_diff(strategy.state.x, expected.x) == 0.0
    assert strategy.state.algo.keys() == expected.algo.keys()
    assert all(max_diff(strategy.state.algo[k], v) == 0.0 for k, v in expected.algo.items())
    # the server keeps the server state only; the clients' states live in the ClientApps' context.state
    assert strategy.state.clients == {}
    trained = {i for h in strategy.history for i in h["trained"]}
    for key, table in expected.clients.items():
        for ctx in grid.contexts.values():
            pid = ctx.node_config["partition-id"]
            stored = ctx.state.array_records.get("fedsl." + key)
            assert (stored is not None) == (pid in trained)
            if stored is not None:
                row = {n: torch.from_numpy(a.numpy()) for n, a in stored.items()}
                assert max_diff(row, {n: v[pid] for n, v in table.items()}) == 0.0


@pytest.mark.parametrize("name", ["fsl", "scaffold"])
def test_text_and_the_char_lstm_on_flower_match_the_simulator(one_thread, tmp_path, name):
    """Shakespeare's roles (a small etext written here) and the character LSTM: the ClientApp and the strategy run
    the simulator's code unchanged, bit for bit, with D0 from roles that are not clients."""
    from test_shakespeare import WORKS
    (tmp_path / "complete-works-part.txt").write_text(WORKS)
    rc = {**BASE, "algorithm.name": name, "rounds": 3, "data.dataset": "shakespeare", "data.data_dir": str(tmp_path),
          "data.partition": "natural", "data.num_clients": 3, "data.seq_length": 8, "data.min_samples": 1,
          "data.server_source": "other_ids", "data.server_clients": 1, "data.server_size": 0,
          "model.name": "char_lstm_small", "algorithm.batch_size": 3, "algorithm.local_steps": 2,
          "algorithm.local_lr": 0.5}
    for key in ("data.chars", "data.train_per_class", "data.test_per_class", "data.classes_per_client",
                "data.samples_per_client"):
        rc.pop(key)
    strategy, _ = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["trained"] for h in strategy.history] == [i.clients.tolist() for i in infos]
    assert max_diff(strategy.state.x, expected.x) == 0.0
    assert [h["server_steps"] > 0 for h in strategy.history] == [name == "fsl"] * 3
    x0 = prepare(parse_run_config(rc)[0]).sim.initial_state().x
    assert max_diff(strategy.state.x, x0) > 1e-3  # it trained


def test_feddu_gamma_and_finetune_match_the_simulator(one_thread, tmp_path):
    """FedDU's γ_t on Flower are the simulator's; server.finetune_epochs fine-tunes the final model on D0 in
    ``finish`` and writes its accuracy to done.json, as ``fedsl run`` writes it to summary.json."""
    rc = {**BASE, "algorithm.name": "feddu", "rounds": 3, "server.finetune_epochs": 2, "out-dir": str(tmp_path)}
    strategy, _ = run_flower(rc)
    expected, infos = run_simulator(rc)
    assert [h["gamma"] for h in strategy.history] == pytest.approx([i.gamma for i in infos], rel=1e-12)
    assert any(h["gamma"] > 0 for h in strategy.history)
    strategy.finish()
    done = json.loads((tmp_path / "done.json").read_text())
    cfg, _ = parse_run_config(rc)
    sim = prepare(cfg).sim
    assert done["final_accuracy_finetuned"] == sim.evaluate(sim.finetune(expected.x, 2, 0.05, 10))[0]


def test_the_plain_mean_is_not_weighted_by_example_count(one_thread):
    """Unequal n_i: FedAvg's mean of Δ_i (Algorithm 1) differs from the n_i-weighted one, and
    the strategy gives the former unless ``algorithm.weighted``."""
    rc = {**BASE, "data.partition": "dirichlet", "data.dirichlet_alpha": 0.3, "rounds": 1,
          "server.learning": "off", "algorithm.name": "fedavg"}
    plain, _ = run_flower(rc)
    weighted, _ = run_flower({**rc, "algorithm.weighted": True})
    sizes = {r["node"]: r["metrics"]["metrics"]["num-examples"] for r in plain.received if r["kind"] == "train"}
    assert len(set(sizes.values())) > 1
    assert max_diff(plain.state.x, weighted.state.x) > 1e-6


# ----------------------------------------------------------------------------- failures and fallbacks

def test_a_sampled_client_without_a_node_is_skipped_and_server_learning_still_runs(one_thread):
    rc = {**BASE, "rounds": 4}
    strategy, _ = run_flower(rc, partitions={100: 0, 101: 1})  # nobody holds partitions 2 and 3
    _, infos = run_simulator(rc)
    for h, info in zip(strategy.history, infos):
        assert h["sampled"] == info.clients.tolist()
        assert h["trained"] == [i for i in info.clients.tolist() if i in (0, 1)]
        assert h["missing"] == [i for i in info.clients.tolist() if i not in (0, 1)]
        assert h["server_steps"] == info.server_steps > 0
    assert len(strategy.history) == 4


def test_a_node_that_stops_answering_is_dropped_and_the_round_completes(one_thread):
    rc = {**BASE, "rounds": 3, "algorithm.clients_per_round": 4}
    strategy, grid = run_flower(rc, fail={102})
    first = strategy.history[0]
    assert first["trained"] == [0, 1, 3] and first["lost_partitions"] == [2] and first["server_steps"] > 0
    assert all(h["missing"] == [2] and h["trained"] == [0, 1, 3] for h in strategy.history[1:])
    assert sum(m.metadata.dst_node_id == 102 and m.metadata.message_type == "train" for m in grid.sent) == 1


def test_a_node_with_a_bad_partition_id_is_refused_with_the_value_named(one_thread):
    rc = {**BASE, "rounds": 2}
    strategy, _ = run_flower(rc, partitions={100: 0, 101: 1, 102: 2, 103: 3, 104: 7})
    errors = [r["error"] for r in strategy.received if "error" in r]
    assert len(errors) == 1 and "partition-id = 7" in errors[0] and "data.num_clients = 4" in errors[0]
    assert 104 in strategy.dropped and len(strategy.history) == 2


def test_partition_id_errors_are_one_line_naming_the_value():
    assert partition_id({"partition-id": 2}, 3) == 2
    assert partition_id({"partition-id": 0, "num-partitions": 3}, 3) == 0
    cases = [({}, "no partition-id"), ({"partition-id": 3}, "partition-id = 3"),
             ({"partition-id": -1}, "partition-id = -1"), ({"partition-id": "a"}, "partition-id = 'a'"),
             ({"partition-id": True}, "partition-id = True"),
             ({"partition-id": 0, "num-partitions": 5}, "num-partitions = 5")]
    for node_config, needle in cases:
        with pytest.raises(ValueError) as err:
            partition_id(node_config, 3)
        assert needle in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the config

def app_config() -> dict:
    return flatten_dict(tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def test_the_example_app_config_is_a_valid_fedsl_config():
    cfg, options = parse_run_config(app_config(), APP)
    assert cfg.algorithm.name == "fsl" and cfg.data.num_clients == 3 and not cfg.algorithm.weighted
    assert options.round_timeout == 300.0 and options.min_nodes == 3 and options.out_dir == ""
    cfg, _ = parse_run_config({**app_config(), "server.gamma": 0.5, "rounds": 7}, APP)
    assert cfg.server.gamma == 0.5 and cfg.rounds == 7


def test_a_preset_or_config_file_with_a_variant(tmp_path):
    cfg, _ = parse_run_config({"preset": "quickstart", "variant": "FSL", "rounds": 2})
    assert cfg.algorithm.name == "fsl" and cfg.rounds == 2 and cfg.data.num_clients == 20
    (tmp_path / "my.toml").write_text('rounds = 5\n[data]\ndataset = "synthetic_chars"\nserver_size = 10\n'
                                      '[algorithm]\nname = "fsl"\n')
    cfg, _ = parse_run_config({"config-file": "my.toml", "algorithm.local_lr": 0.1}, tmp_path)
    assert cfg.rounds == 5 and cfg.algorithm.local_lr == 0.1


@pytest.mark.parametrize("run_config, needle", [
    ({"preset": "quickstart"}, "variant = \"NAME\""),
    ({"preset": "quickstart", "variant": "Nope"}, "variant = 'Nope'"),
    ({"preset": "quickstart", "config-file": "x.toml"}, "expected at most one"),
    ({"config-file": "/nonexistent/x.toml"}, "/nonexistent/x.toml"),
    ({**BASE, "algorithm.lr": 0.1}, "algorithm.lr"),
    ({**BASE, "algorithm.local_lr": -1.0}, "algorithm.local_lr = -1.0"),
    ({**BASE, "round-timeout": 0.0}, "round-timeout = 0.0"),
    ({**BASE, "round-timeout": "soon"}, "round-timeout = 'soon'"),
    ({**BASE, "min-nodes": -2}, "min-nodes = -2"),
])
def test_bad_run_configs_are_refused_in_one_line(run_config, needle):
    with pytest.raises(ConfigError) as err:
        parse_run_config(run_config)
    assert needle in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the grid wrapper

class _SlowGrid:
    """push/pull over a fake link: replies become available at given times (None: never)."""

    def __init__(self, delays: list[float | None]) -> None:
        import time
        self.time, self.delays, self.t0 = time, delays, None

    def push_messages(self, messages):
        self.t0 = self.time.monotonic()
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids):
        now = self.time.monotonic() - self.t0
        out = []
        for i, d in enumerate(self.delays):
            if f"m{i}" in ids and d is not None and now >= d:
                msg = Message(RecordDict(), dst_node_id=1, message_type="train")
                msg.metadata.__dict__["_message_id"] = f"m{i}"
                out.append(Message(RecordDict(), reply_to=msg))
        return out


def test_round_grid_stops_waiting_for_stragglers():
    import time
    grid = RoundGrid(_SlowGrid([0.0, 0.1, None]), poll=0.02, straggler=0.3)
    start = time.monotonic()
    replies = grid.send_and_receive([object()] * 3, timeout=30)
    assert len(replies) == 2 and time.monotonic() - start < 2
    grid = RoundGrid(_SlowGrid([0.0, None]), poll=0.02)
    start = time.monotonic()
    assert len(grid.send_and_receive([object()] * 2, timeout=0.3)) == 1 and time.monotonic() - start < 2


def test_the_initial_arrays_given_to_start_are_x0(one_thread):
    """``strategy.start(grid, initial_arrays)`` starts from those arrays (e.g. a checkpoint), as the simulator would."""
    from fedsl.engine.simulator import RunState
    rc = {**BASE, "rounds": 2}
    setup = load_setup(rc)
    x0 = {n: p + 0.01 for n, p in setup.sim.initial_params().items()}
    strategy = FedslStrategy(setup)
    strategy.start(LoopGrid(rc, {100 + i: i for i in range(4)}), to_record(x0), num_rounds=2, timeout=5.0,
                   evaluate_fn=strategy.evaluate)
    cfg, _ = parse_run_config(rc)
    sim = prepare(cfg).sim
    expected, _ = run_rounds(sim, 2, RunState(x0, sim.alg.rule.init_server_state(x0)))
    assert max_diff(strategy.state.x, expected.x) == 0.0
    assert strategy.evaluations[0]["accuracy"] == sim.evaluate(x0)[0]
