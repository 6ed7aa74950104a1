"""Secure aggregation (run config ``secagg = true``): FSL under Flower's SecAgg+ (docs/how-to/secure-aggregation.md).

- in one process, the whole protocol (Flower's ``SecAggPlusWorkflow`` and ``secaggplus_mod``, fedsl's ClientApps):
  each round's aggregate is the mean of the models the clients trained (replayed here) within SecAgg+'s
  quantisation bound 2c/Q, not bit for bit (it went through the masked integer sum); x_{t+1} is fedsl's server
  update on it, then server learning, exactly; no reply carries an array in clear;
- ``algorithm.weighted``: the aggregate is the num-examples-weighted mean (unequal n_i);
- a client that fails in the middle of the protocol: SecAgg+ removes its masks and the round aggregates the others;
- ``aggregate_fit`` on a made-up aggregate: x̄ = x + η_g·(agg - x), by hand; a reply with a bad SecAgg+ weight
  spoils the sum: no client update that round, then server learning; a halted round (fewer than 2 nodes) still runs
  server learning;
- what cannot run under SecAgg+ is refused in one line, and with ``secagg = true`` a client refuses a plain train
  message (it would send x_i in clear);
- real processes on 127.0.0.1: ``check_fsl_under_secagg``, a round of FSL under SecAgg+ on 3 SuperNodes, which
  ``test_flower_deployment`` runs on the SuperLink and SuperNodes of its TLS test.
"""

from __future__ import annotations

import copy
import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from conftest import flower_rc, max_diff
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.compat.grid_client_proxy import GridClientProxy
from test_flower_protocol import APP, BASE, Grid, fedsl_nodes

from fedsl.algorithms.base import ClientResults, RunState
from fedsl.algorithms.server_round import server_update
from fedsl.config.schema import ConfigError
from fedsl.flower import FedslStrategy, load_setup, make_client_app, parse_run_config, train_partition
from fedsl.flower.records import to_record
from fedsl.flower.secagg import SecAggStrategy, aggregate_error_bound, quantised_weight
from fedsl.flower.server import run_server

pytestmark = pytest.mark.usefixtures("flower_task_identity")

# FSL in float64 on "mlp", an open federation of 4 nodes (partition-id 0..3), S = 3, 3 rounds, under SecAgg+
SECAGG = {**BASE, "federation": "open", "secagg": True, "algorithm.clients_per_round": 3}
STEP = 2 * 8.0 / 2**22  # 2c/Q with Flower's defaults (c = 8, Q = 2^22): the aggregate's error bound, w_i = 1


class SecAggGrid(Grid):
    """The in-process Grid, as a SuperLink delivers: each node gets its own copy of a message (SecAgg+'s mod pops
    the stage from the content it is given), and the legacy workflow's client manager reads ``grid.run``."""

    run = types.SimpleNamespace(run_id=1)

    def _reply(self, msg: Message) -> Message:
        msg.metadata.__dict__["_message_id"] = f"m{len(self.sent)}"
        return super()._reply(copy.deepcopy(msg))


def serve(run_config: dict, nodes: dict, **grid_kw) -> tuple[FedslStrategy, SecAggGrid]:
    grid = SecAggGrid(run_config, nodes, **grid_kw)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    return run_server(grid, ctx), grid


@pytest.fixture
def rounds_seen(monkeypatch):
    """(t, x_t, the unmasked aggregate, the clients' rows, x_{t+1}) of every round ``aggregate_fit`` saw."""
    seen = []
    original = SecAggStrategy.aggregate_fit

    def spy(self, server_round, results, failures):
        t = self.core.offset + server_round - 1
        x_t = {n: v.clone() for n, v in self.core.state.x.items()}
        agg = self.read_aggregate(results[0][1].parameters)
        rows = [(p.node_id, f.metrics, f.num_examples) for p, f in results]
        out = original(self, server_round, results, failures)
        seen.append((t, x_t, agg, rows, {n: v.clone() for n, v in self.core.state.x.items()}))
        return out

    monkeypatch.setattr(SecAggStrategy, "aggregate_fit", spy)
    return seen


def client_models(run_config: dict, x_t: dict, t: int, partitions: list[int]) -> list[dict]:
    """The models the clients of ``partitions`` trained from x_t in round t (fedsl's client update, replayed)."""
    sim = load_setup(run_config, APP, client=True).sim
    return [train_partition(sim, x_t, t, pid)[0] for pid in partitions]


def weighted_mean(models: list[dict], weights: list[float]) -> dict:
    w = torch.tensor(weights, dtype=torch.float64) / sum(weights)
    return {n: sum(wi * m[n].double() for wi, m in zip(w, models)) for n in models[0]}


def test_each_round_aggregates_the_mean_of_the_clients_models_then_server_learning(one_thread, tmp_path, rounds_seen):
    rc = {**SECAGG, "out-dir": str(tmp_path)}
    strategy, grid = serve(rc, fedsl_nodes(4))
    assert (tmp_path / "done.json").exists() and len(rounds_seen) == 3
    setup = load_setup(rc)
    for t, x_t, agg, rows, x_next in rounds_seen:
        partitions = [m["partition-id"] for _, m, _ in rows]
        assert len(partitions) == 3 and all(w == 1 for *_, w in rows)  # the plain mean: every weight 1
        mean = weighted_mean(client_models(rc, x_t, t, partitions), [1, 1, 1])
        err = max_diff(agg, mean)
        print(f"round {t + 1}: max |aggregate - mean x_i| = {err:.3g} (bound 2c/Q = {STEP:.3g})")
        assert 0 < err <= STEP  # quantised in SecAgg+'s integer sum, within one step of 2c/Q
        # x_{t+1}: fedsl's server half with every client's row = the aggregate (FedAvg, η_g = 1: x̄ = agg), then
        # line 10 on D0, exactly
        nodes = sorted(n for n, _, _ in rows)
        results = ClientResults({n: torch.stack([agg[n]] * 3) for n in agg}, [24] * 3, (2, 2, 2))
        state = RunState(x_t, {}, None)
        expected, m = server_update(setup.algorithm, state, results, t, setup.sim.server)
        assert max_diff(x_next, expected.x) == 0.0 and m.server_steps > 0
        assert strategy.history[t]["trained"] == nodes
    history = json.loads((tmp_path / "rounds.json").read_text())
    assert all(h["server_steps"] == 4 and h["secagg"]["error_bound"] == STEP and h["secagg"]["clipped"] == 0
               for h in history)
    assert max_diff(strategy.state.x, rounds_seen[-1][4]) == 0.0
    # what the server received: SecAgg+'s keys, encrypted shares and masked vectors; not one array in clear
    received = json.loads((tmp_path / "received.json").read_text())
    assert received and all(arrays == {} for e in received for arrays in e["arrays"].values())
    masked = [e for e in received if e["kind"] == "train:collect_masked_vectors"]
    assert len(masked) == 9 and all("masked_params" in e["configs"]["secaggplus_configs"] for e in masked)
    assert {e["kind"] for e in received} == {"train:setup", "train:share_keys", "train:collect_masked_vectors",
                                             "train:unmask"}
    # the train message (SecAgg+'s legacy FitIns) carries what fedsl's open federation sends, and the weighting
    fitins = [m for m in grid.sent if "fitins.config" in m.content.config_records]
    config = fitins[0].content.config_records["fitins.config"]
    assert config["round"] == 0 and config["lr"] == 0.05 and config["secagg-weighted"] is False
    assert len(fitins) == 9 and all(len(m.content.array_records["fitins.parameters"]) == len(setup.sim.fm.names)
                                   for m in fitins)


def test_weighted_secagg_gives_the_num_examples_weighted_mean(one_thread, rounds_seen):
    """Unequal n_i (Dirichlet partition), algorithm.weighted: SecAgg+ weights by the quantised n_i."""
    rc = {**SECAGG, "rounds": 2, "algorithm.weighted": True, "data.partition": "dirichlet",
          "data.dirichlet_alpha": 0.5, "algorithm.batch_size": 8}
    top = max(len(c) for c in load_setup(rc).fed.clients)
    rc["max-examples"] = top  # Flower's max_weight: n_i / max_weight near 1 keeps the quantisation fine
    serve(rc, fedsl_nodes(4))
    for t, x_t, agg, rows, _ in rounds_seen:
        partitions = [m["partition-id"] for _, m, _ in rows]
        sizes = [m["num-examples"] for _, m, _ in rows]
        assert [w for *_, w in rows] == sizes and len(set(sizes)) > 1  # w_i = n_i, unequal
        models = client_models(rc, x_t, t, partitions)
        q = [quantised_weight(n, top, 2**22) for n in sizes]
        bound = aggregate_error_bound(sizes, top, 8.0, 2**22)
        assert max_diff(agg, weighted_mean(models, q)) <= bound
        assert max_diff(agg, weighted_mean(models, [1] * len(sizes))) > 100 * bound  # not the plain mean


def test_a_client_that_fails_mid_protocol_is_unmasked_away(one_thread, tmp_path, rounds_seen):
    """Node 101 fails in round 1's masked-vector stage: SecAgg+ rebuilds its pairwise masks from its neighbours'
    shares, the round aggregates the other two, and node 101 is left out of the rest of the run."""
    def fail_once(msg: Message, reply: Message) -> Message:
        if "fitres.parameters" in reply.content.array_records and not fail_once.done:
            fail_once.done = True
            return Message(Error(code=1, reason="node 101 crashed"), reply_to=msg)
        return reply
    fail_once.done = False
    rc = {**SECAGG, "out-dir": str(tmp_path)}
    strategy, _ = serve(rc, fedsl_nodes(4), tamper={101: fail_once})
    t, x_t, agg, rows, _ = rounds_seen[0]
    assert t == 0 and strategy.history[0]["sampled"] == [100, 101, 103]
    assert strategy.history[0]["trained"] == [100, 103] and strategy.history[0]["lost_partitions"] == [101]
    mean = weighted_mean(client_models(rc, x_t, 0, [m["partition-id"] for _, m, _ in rows]), [1, 1])
    assert sorted(m["partition-id"] for _, m, _ in rows) == [0, 3] and max_diff(agg, mean) <= STEP
    assert all(101 not in h["sampled"] for h in strategy.history[1:])
    assert all(h["server_steps"] > 0 for h in strategy.history)


class ShiftClient(NumPyClient):
    """A stock Flower client (the legacy NumPyClient, no fedsl): returns x_t + 0.01·(i + 1), n_i = 10·(i + 1)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def fit(self, parameters, config):
        return [p + 0.01 * (self.pid + 1) for p in parameters], 10 * (self.pid + 1), {"train_loss": 0.5}


def test_a_stock_numpy_client_with_secaggplus_mod_takes_part(one_thread, rounds_seen):
    """Flower's legacy route: a NumPyClient's ClientApp with ``secaggplus_mod``, its FitRes weighted by its n_i
    (algorithm.weighted): the aggregate is x_t + Σ q_i·0.01(i + 1) / Σ q_i, q_i = round(n_i / 30 · Q)."""
    app = ClientApp(client_fn=lambda context: ShiftClient(context.node_config["partition-id"]).to_client(),
                    mods=[secaggplus_mod])
    rc = {**SECAGG, "rounds": 1, "algorithm.weighted": True, "max-examples": 30}
    strategy, _ = serve(rc, {100 + i: (app, {"partition-id": i}) for i in range(3)})
    (t, x_t, agg, rows, _), = rounds_seen
    q = [quantised_weight(n, 30, 2**22) for n in (10, 20, 30)]
    shift = sum(qi * 0.01 * (i + 1) for i, qi in enumerate(q)) / sum(q)
    assert max_diff(agg, {n: v + shift for n, v in x_t.items()}) <= aggregate_error_bound([10, 20, 30], 30, 8.0, 2**22)
    h = strategy.history[0]
    assert h["trained"] == [100, 101, 102] and h["client_steps"] == [2, 2, 4] and h["server_steps"] == 4
    assert h["train_loss"] == 0.5


# ----------------------------------------------------------------------------- aggregate_fit by hand

def _fitres(agg: list[np.ndarray], weight: int, **metrics) -> FitRes:
    return FitRes(Status(Code.OK, "Success"), ndarrays_to_parameters(agg), weight,
                  {"num-examples": 24, "round": 0, **metrics})


def _strategy(**extra) -> SecAggStrategy:
    return SecAggStrategy(FedslStrategy(load_setup(flower_rc(SECAGG, extra))))


def test_aggregate_fit_applies_the_server_update_to_a_made_up_aggregate(one_thread):
    """FedAvg (no server learning) with η_g = 0.5: x̄ = x + 0.5·(agg - x), entry by entry."""
    strategy = _strategy(**{"algorithm.name": "fedavg", "algorithm.global_lr": 0.5})
    x = {n: v.clone() for n, v in strategy.core.state.x.items()}
    agg = [np.full(tuple(x[n].shape), 0.25) for n in strategy.names]
    strategy.configure_fit(1, strategy.parameters(), types.SimpleNamespace(all=lambda: {}))
    proxies = [GridClientProxy(n, None, 1) for n in (7, 8, 9)]
    params, metrics = strategy.aggregate_fit(1, [(p, _fitres(agg, 1)) for p in proxies], [])
    assert metrics == {"clients": 3, "server-steps": 0}
    assert max_diff(strategy.core.state.x, {n: x[n] + 0.5 * (0.25 - x[n]) for n in x}) <= 1e-16  # float rounding
    assert strategy.core.history[0]["trained"] == [7, 8, 9] and strategy.core.history[0]["client_steps"] == [2] * 3


def test_feddyn_reads_the_aggregate_once_per_client(one_thread):
    """FedDyn's h = h - α·Σ_{i∈S} (x_i - x)/N counts the round's S clients: with every row = agg it is
    -α·S·(agg - x)/N (S = 3, N = 4, α = 0.01), and x̄ = mean x_i - h/α = agg - h/α, by hand."""
    strategy = _strategy(**{"algorithm.name": "feddyn"})
    x = {n: v.clone() for n, v in strategy.core.state.x.items()}
    agg = [np.full(tuple(x[n].shape), 0.25) for n in strategy.names]
    proxies = [GridClientProxy(n, None, 1) for n in (7, 8, 9)]
    strategy.aggregate_fit(1, [(p, _fitres(agg, 1, steps=2)) for p in proxies], [])
    h = {n: -0.01 * 3 * (0.25 - x[n]) / 4 for n in x}
    assert max_diff(strategy.core.state.algo["h"], h) <= 1e-17
    assert max_diff(strategy.core.state.x, {n: 0.25 - h[n] / 0.01 for n in x}) <= 1e-15


def test_a_reply_with_a_wrong_secagg_weight_spoils_the_round(one_thread, caplog):
    """A weight of 24 under the plain mean: the masked sum holds it and cannot be taken apart, so no client update
    (x̄ = x_t), then server learning; one line names the node."""
    strategy = _strategy()
    x = {n: v.clone() for n, v in strategy.core.state.x.items()}
    agg = [np.zeros(tuple(x[n].shape)) for n in strategy.names]
    p1, p2 = GridClientProxy(1, None, 1), GridClientProxy(2, None, 1)
    strategy.aggregate_fit(1, [(p1, _fitres(agg, 1)), (p2, _fitres(agg, 24))], [])
    h = strategy.core.history[0]
    assert h["trained"] == [] and h["server_steps"] == 4 and max_diff(strategy.core.state.x, x) > 0
    assert "the reply of node 2 is unusable: SecAgg+ weight num_examples = 24: expected 1 (the plain mean; " \
        in caplog.text
    assert h["rejected"][0]["node"] == 2


def test_a_halted_round_still_runs_server_learning(one_thread, tmp_path):
    """One node connected: SecAgg+ needs at least 2 and halts every round; each still runs line 10, and the run
    fails at the end as any run without a client update."""
    from fedsl.flower.server import NoClientUpdate

    rc = {**SECAGG, "out-dir": str(tmp_path), "rounds": 2}
    with pytest.raises(NoClientUpdate):
        serve(rc, dict(list(fedsl_nodes(4).items())[:1]))
    history = json.loads((tmp_path / "rounds.json").read_text())
    assert [h["secagg"] for h in history] == [{"halted": True}] * 2 and all(h["server_steps"] == 4 for h in history)


def test_no_node_at_all_fails_at_once_under_secagg_too(one_thread, tmp_path):
    """No node connected within node-wait (min-nodes ≥ 1): the SecAgg+ ServerApp fails before its first round, in
    the same line as the plain one, with failed.json; min-nodes = 0 would go on."""
    from fedsl.flower.strategy import NoNodes

    rc = {**SECAGG, "out-dir": str(tmp_path), "rounds": 2, "min-nodes": 1}
    with pytest.raises(NoNodes, match="^fedsl: no SuperNode connected within node-wait = 0 s \\(min-nodes = 1\\)"):
        serve(rc, {})
    assert "no SuperNode connected" in json.loads((tmp_path / "failed.json").read_text())["reason"]


def test_every_node_lost_mid_run_fails_with_the_rounds_done_checkpointed_under_secagg_too(one_thread, tmp_path,
                                                                                       monkeypatch):
    """Round 2 finds the client manager empty (every node gone): it waits node-wait for one, then fails as the plain
    ServerApp does, round 1 checkpointed (checkpoint_every = 5 had not saved it), instead of a server-only round."""
    from flwr.server.client_manager import SimpleClientManager

    from fedsl.flower.strategy import NoNodes

    original = SecAggStrategy.configure_fit
    monkeypatch.setattr(SecAggStrategy, "configure_fit", lambda self, r, p, cm: original(
        self, r, p, cm if r == 1 else SimpleClientManager()))
    rc = {**SECAGG, "out-dir": str(tmp_path), "rounds": 3, "min-nodes": 1, "checkpoint_every": 5}
    with pytest.raises(NoNodes, match="^fedsl: no SuperNode connected within node-wait = 0 s .* continues from "
                                      "round 2$"):
        serve(rc, fedsl_nodes(4))
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["round"] == 1
    assert [h["round"] for h in json.loads((tmp_path / "rounds.json").read_text())] == [1]
    assert "no SuperNode connected" in json.loads((tmp_path / "failed.json").read_text())["reason"]


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("extra, needle", [
    ({"federation": "replay"}, 'secagg = true with federation = "replay": secure aggregation runs in an open'),
    ({"robust.aggregator": "median"}, "robust.aggregator = 'median' needs every client's model x_i"),
    ({"privacy.clip": 1.0, "privacy.noise_multiplier": 1.0}, "privacy.clip = 1.0 clips each client's update on the "
                                                             "server, and under secagg = true"),
    ({"algorithm.name": "scaffold"}, "algorithm.name = 'scaffold' updates its control variate c with each client's"),
    ({"algorithm.name": "fednova"}, "algorithm.name = 'fednova' normalises each client's update by its own local"),
    ({"algorithm.name": "feddf"}, "algorithm.name = 'feddf' distils the ensemble of the round's individual client "
                                  "models on the server; under secagg = true"),
    ({"algorithm.name": "feddyn", "algorithm.weighted": True}, "algorithm.name = 'feddyn' averages the models plainly"),
    ({"algorithm.clients_per_round": 1}, "algorithm.clients_per_round = 1 with secagg = true: SecAgg+ sums"),
    ({"secagg-shares": 2}, "run config secagg-shares = 2: expected an integer in 3..algorithm.clients_per_round = 3"),
    ({"secagg-shares": 1.5}, "run config secagg-shares = 1.5: expected a fraction in (0, 1]"),
    ({"secagg-shares": "all"}, "run config secagg-shares = 'all': expected an integer or a fraction"),
    ({"secagg-shares": 3, "secagg-threshold": 3}, "run config secagg-threshold = 3: expected an integer in 2..2"),
    ({"secagg-threshold": 0.0}, "run config secagg-threshold = 0.0: expected a fraction in (0, 1]"),
    ({"secagg-clipping-range": -1.0}, "run config secagg-clipping-range = -1.0: expected a finite number > 0"),
    ({"secagg-quantization-range": 2**31}, "run config secagg-quantization-range = 2147483648 with algorithm."
                                           "clients_per_round = 3: the sum of the quantised models would wrap"),
    ({"secagg": 1}, "run config secagg = 1: expected a bool"),
])
def test_what_cannot_run_under_secagg_is_refused_in_one_line(extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_run_config(flower_rc(SECAGG, extra))
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_algorithms_that_run_under_secagg_are_accepted():
    for name in ("fedavg", "fsl", "fsl_p", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox", "moon", "feddyn"):
        _, options = parse_run_config(flower_rc(SECAGG, {"algorithm.name": name}))
        assert options.secagg and options.secagg_shares == 1.0 and options.secagg_threshold == 0.67


def test_a_secagg_client_refuses_a_plain_train_message(one_thread):
    """With secagg = true a node sends its model only masked: a plain train message (x_i in clear) fails."""
    app = make_client_app(APP)
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 1}, state=RecordDict(), run_config=SECAGG)
    setup = load_setup(SECAGG, APP, client=True)
    content = RecordDict({"arrays": to_record(setup.sim.initial_params()),
                          "config": ConfigRecord({"round": 0})})
    msg = Message(content, dst_node_id=7, message_type="train")
    msg.metadata.__dict__["_message_id"] = "m1"
    with pytest.raises(ValueError, match="secagg = true: this node sends its model only through SecAgg\\+"):
        app(msg, ctx)
    # the same node without secagg trains and replies x_i in clear
    plain = {**SECAGG, "secagg": False}
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 1}, state=RecordDict(), run_config=plain)
    reply = app(msg, ctx)
    assert isinstance(reply.content.metric_records["metrics"], MetricRecord) and "arrays" in reply.content
    assert math.isfinite(reply.content.metric_records["metrics"]["train-loss"])


# ----------------------------------------------------------------------------- real processes

FEDSL_CLIENT = "from fedsl.flower import make_client_app\n\napp = make_client_app()\n"


def check_fsl_under_secagg(dep, folder: Path) -> None:
    """On ``dep`` (``test_flower_deployment.Deployment``: `flower-superlink` and 3 `flower-supernode`s, partition-id
    0..2, on 127.0.0.1), `flwr run`: a round of FSL under SecAgg+, S = 3, fedsl's ServerApp and ClientApp (its 4
    stages are 12 ClientApp processes; the rounds after the first, and their keys, are checked in process above). The
    run completes with server learning; the server received no array in clear; x_1 is the round replayed here with
    the exact mean, up to SecAgg+'s quantisation (at most 2c/Q on the aggregate, then carried through the server's
    SGD steps). ``test_flower_deployment`` runs it on the SuperNodes of its TLS deployment."""
    from test_flower_deployment import _logs
    from test_flower_protocol import write_plain_app

    out = folder / "out"
    rc = {**SECAGG, "rounds": 1, "out-dir": str(out), "min-nodes": 3, "node-wait": 60.0, "round-timeout": 60.0}
    setup = load_setup(rc)  # also fills the dataset cache the nodes read
    app = write_plain_app(folder / "app", rc, FEDSL_CLIENT)
    res = dep.flwr("run", str(app), "test", "--stream", timeout=240)
    assert res.returncode == 0 and (out / "done.json").exists(), _logs(dep, res)
    assert "secure aggregation (Flower's SecAgg+)" in res.stdout, _logs(dep, res)

    rounds = json.loads((out / "rounds.json").read_text())
    assert len(rounds) == 1 and all(len(r["trained"]) == 3 and r["rejected"] == [] for r in rounds), rounds
    assert all(r["server_steps"] == 4 for r in rounds)  # server learning
    assert all(r["secagg"]["error_bound"] == STEP and r["secagg"]["clipped"] == 0 for r in rounds)
    received = json.loads((out / "received.json").read_text())
    assert all(arrays == {} for e in received for arrays in e["arrays"].values())  # no x_i in clear
    masked = [e for e in received if e["kind"] == "train:collect_masked_vectors"]
    assert len(masked) == 3 and all("masked_params" in e["configs"]["secaggplus_configs"] for e in masked)
    partition = {e["node"]: e["configs"]["fitres.metrics"]["partition-id"] for e in masked}
    assert sorted(partition.values()) == [0, 1, 2]

    # the run replayed with the exact means: each round's clients train from x_t, x̄ = mean (FedAvg), line 10
    client_sim = load_setup(rc, APP, client=True).sim
    state = FedslStrategy(setup).state
    for t, r in enumerate(rounds):
        models = [train_partition(client_sim, state.x, t, partition[n])[0] for n in r["trained"]]
        results = ClientResults({n: torch.stack([m[n] for m in models]) for n in state.x}, [24] * 3,
                                tuple(r["client_steps"]))
        state, _ = server_update(setup.algorithm, state, results, t, setup.sim.server)
    final = torch.load(out / "final.pt")["params"]
    diff = max_diff(final, state.x)
    print(f"max |x_T(SecAgg+) - x_T(exact means)| = {diff:.3g} (2c/Q = {STEP:.3g})")
    # the aggregate is within 2c/Q of its mean and the server's K0 SGD steps on D0 carry that on (a ReLU that
    # switches moves a step by O(η·|g|)): 5.6e-6 measured on real processes; over 2 rounds, 0.8e-5 to 2.3e-5 in 6
    # runs in one process. A wrong aggregate (a sum, one client's model) would be 1e-2 off.
    assert 0 < diff <= 5e-5
