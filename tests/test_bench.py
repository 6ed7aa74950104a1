"""The benchmark harness (benchmarks/harness, not in the library): correctness of what it measures, not speed."""

import os
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import run_benchmarks  # noqa: E402
from harness.peers import ChannelsLastLoopPeer, EnginePeer, LoopPeer  # noqa: E402
from harness.table import COLUMNS, RATIO_PEERS, Row, add_ratios, floors, markdown  # noqa: E402
from harness.workloads import DEFAULT_WORKLOADS, make_data, timed_rounds, workloads  # noqa: E402


def test_workloads_match_the_presets():
    w = workloads()
    assert set(DEFAULT_WORKLOADS) <= set(w)
    s2 = w["s2-cifar10+eval"]
    assert ((s2.num_clients, s2.samples_per_client, s2.clients_per_round, s2.batch_size, s2.steps)
            == (1000, 50, 10, 10, 5))
    s1 = w["s1-cifar10"]
    assert (s1.num_clients, s1.clients_per_round, s1.batch_size, s1.steps, s1.evaluate) == (10, 4, 50, 100, False)
    assert w["s1-emnist"].steps == 48 and w["s2-emnist"].steps == 5
    assert w["s2-cifar10-8seeds+eval"].seeds == 8
    assert s2.train_samples_per_round == 500 and s2.eval_samples_per_round == 10_000
    assert timed_rounds(s1, 3) == 1 and timed_rounds(s2, 3) == 3
    assert set(workloads(smoke=True)) == set(w)


def test_engine_and_plain_loop_give_the_same_fedavg_model(one_thread):
    """On the same clients and batch order (dropout-free model), the engine's FedAvg round and the
    plain loop (deepcopy + DataLoader + SGD + mean of state dicts) agree to float32 rounding."""
    w = replace(workloads(smoke=True)["s2-cifar10"], model="mlp", num_clients=8, clients_per_round=3,
                samples_per_client=10, batch_size=4, epochs=2, lr=0.1, test_size=16)
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, loop = EnginePeer(w, data, cpu), LoopPeer(w, data, cpu, share_plan=True)
    for p in (engine, loop):
        p.setup()  # one round
        assert len(p.run(2)) == 2
    mine, theirs = engine.params(), loop.models[0].state_dict()
    assert set(mine) == set(theirs)
    for n in mine:
        torch.testing.assert_close(mine[n], theirs[n], rtol=1e-5, atol=1e-6)
    # and the model moved: the comparison is not between two untouched initialisations
    from harness.peers import plain_model
    init = plain_model(w, 0, cpu).state_dict()
    assert max((mine[n] - init[n]).abs().max().item() for n in mine) > 1e-3


def test_the_fsl_workload_and_its_loop_are_the_engines_fsl(one_thread):
    """s2-cifar10-fsl is the preset's FSL on Scenario 2 (n0 = 500, K0 = 50 server steps of B = 10 after the mean).
    On the same clients and batch orders (dropout-free model), the plain loop's FSL round (mean, then SGD on D0) and
    the engine's (η_g = 1, γ = 1, η0 = η_l) agree to float32 rounding, and differ from FedAvg's."""
    fsl = workloads()["s2-cifar10-fsl"]
    assert (fsl.server_samples, fsl.server_steps, fsl.train_samples_per_round) == (500, 50, 1000)
    w = replace(workloads(smoke=True)["s2-cifar10-fsl"], model="mlp", num_clients=8, clients_per_round=3,
                samples_per_client=10, batch_size=4, epochs=2, lr=0.1, test_size=16)
    assert w.server_samples == 8 and w.server_steps == 2 and "FSL: n0=8, K0=2" in w.describe()
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, loop = EnginePeer(w, data, cpu), LoopPeer(w, data, cpu, share_plan=True)
    fedavg = LoopPeer(replace(w, server_samples=0), data, cpu, share_plan=True)
    for p in (engine, loop, fedavg):
        p.setup()  # one round
        p.run(1)
    assert engine.sims[0].alg.name == "fsl"
    mine, theirs, avg = engine.params(), loop.models[0].state_dict(), fedavg.models[0].state_dict()
    for n in mine:
        torch.testing.assert_close(mine[n], theirs[n], rtol=1e-5, atol=1e-6)
    assert max((theirs[n] - avg[n]).abs().max().item() for n in avg) > 1e-3  # the server's steps moved it


def test_shakespeare_workloads_are_the_presets_round_on_uint8_windows():
    """shakespeare-small / shakespeare: the preset shakespeare.toml's round (S = 10, K = 20 steps of B = 10, a
    10,000-window test set) on N = 100 clients of 200 windows, with char_lstm_small and LEAF's char_lstm; not
    in the default list; their data are uint8 character indices < 80 [n, 80] (images stay floats in [0, 1)),
    and the smoke form stays text, tiny."""
    from harness.workloads import TEXT_MODELS, is_heavy
    w = workloads()
    for name, model in (("shakespeare-small", "char_lstm_small"), ("shakespeare", "char_lstm")):
        s = w[name]
        assert (s.model, s.num_clients, s.samples_per_client, s.clients_per_round, s.batch_size, s.steps,
                s.test_size, s.evaluate) == (model, 100, 200, 10, 10, 20, 10_000, False)
        assert w[name + "+eval"].evaluate and name not in DEFAULT_WORKLOADS and name + "+eval" not in DEFAULT_WORKLOADS
        assert (s.input_shape, s.num_classes) == ((80,), 80) and s.model in TEXT_MODELS
    assert is_heavy(w["shakespeare"]) and not is_heavy(w["shakespeare-small+eval"])
    small = workloads(smoke=True)["shakespeare"]
    assert (small.model, small.num_clients, small.samples_per_client, small.test_size) == ("char_lstm_small", 6, 12, 40)
    data = make_data(small)
    for x in (data.x, data.x_test):
        assert x.dtype == torch.uint8 and x.shape[1:] == (80,) and int(x.max()) < 80 and int(x.max()) > 40
    assert data.x.shape[0] == 6 * 12 and data.y.max() < 80
    img = make_data(workloads(smoke=True)["s2-cifar10"]).x
    assert img.dtype == torch.float32 and 0 <= img.min() and img.max() < 1


def test_lstm_flops_are_counted_and_the_rates_take_text_inputs(one_thread):
    """FlopCounterMode counts nothing in nn.LSTM's fused kernel; the harness counts the LSTM as its plain-operations
    form: char_lstm_small's forward is exactly the matmuls L·2·4H·(in + H) per layer + the dense layer's 2·H·V;
    backward twice that, less the products with the zero initial state. The best rates run on uint8 windows."""
    from harness import machine
    from harness.peers import plain_model
    from harness.workloads import random_inputs
    w = workloads()["shakespeare-small"]
    m = plain_model(w, 0, torch.device("cpu"))
    make = lambda n: random_inputs(w.model, n)  # noqa: E731
    L, E, H, V = 80, 8, 64, 80
    fwd = L * 2 * 4 * H * (E + H) + L * 2 * 4 * H * (H + H) + 2 * H * V
    assert machine.flops_per_sample(m, (80,), 80, False, make_input=make) == fwd
    assert machine.flops_per_sample(m, (80,), 80, True, make_input=make) == 3 * fwd - 2 * (2 * 4 * H * H)
    assert not m.lstm._forward_hooks  # the counting hooks are gone
    r = machine.best_rates(lambda: plain_model(w, 0, torch.device("cpu")), (80,), 80, torch.device("cpu"),
                           train_batches=(4,), eval_batches=(4,), repeats=1, make_input=make)
    assert r.train_flops == 3 * fwd - 4 * 4 * H * H and r.train_samples_s > 0 and r.eval_samples_s > 0


def test_engine_and_plain_loop_give_the_same_char_lstm_model(one_thread):
    """On uint8 character windows, the engine's FedAvg round (sequential executor, nn.LSTM's kernel) and the
    plain loop (the module called on the uint8 batches) on the same clients and batches agree to float32
    rounding; the vectorised executor (the plain-operations LSTM under vmap) agrees too."""
    from harness.peers import VectorisedPeer, plain_model
    w = replace(workloads(smoke=True)["shakespeare-small"], num_clients=6, clients_per_round=2, samples_per_client=6,
                batch_size=3, lr=0.5, test_size=8)
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, vec, loop = EnginePeer(w, data, cpu), VectorisedPeer(w, data, cpu), LoopPeer(w, data, cpu, share_plan=True)
    for p in (engine, vec, loop):
        p.setup()  # one round
        p.run(1)
    assert engine.sims[0].executor.name == "sequential" and vec.sims[0].executor.name == "vectorised"
    assert engine.sims[0].fed.x.dtype == torch.uint8
    mine, theirs, vectorised = engine.params(), loop.models[0].state_dict(), vec.params()
    assert set(mine) == set(theirs)
    for n in mine:
        torch.testing.assert_close(mine[n], theirs[n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(vectorised[n], theirs[n], rtol=1e-5, atol=1e-6)
    init = plain_model(w, 0, cpu).state_dict()
    assert max((mine[n] - init[n]).abs().max().item() for n in mine) > 1e-3


def test_smoke_run_of_the_shakespeare_workloads(one_thread):
    """Both char-LSTM workloads, with and without evaluation, through fedsl (sequential), fedsl vectorised (an
    optional peer, not in the default list) and the plain loop: every row timed, its ratios and FLOPs (the LSTM's
    counted) reported."""
    from harness import OPTIONAL_PEERS, PEERS
    from harness.command import parser
    assert "vectorised" in OPTIONAL_PEERS and "vectorised" not in PEERS
    assert "vectorised" in " ".join(parser().format_help().split())
    names = ["shakespeare-small", "shakespeare+eval"]
    rep = run_benchmarks(names, rounds=1, reps=1, smoke=True, peers=("fedsl", "vectorised", "loop"),
                         footprint_clients=None, threads=1, log=lambda s: None)
    got = {(r.workload, r.peer): r for r in rep.rows}
    for name in names:
        for peer in ("fedsl", "fedsl vectorised", "plain loop"):
            r = got[(name, peer)]
            assert r.seconds and r.seconds > 0 and r.gflops > 0, (name, peer, r.note)
        assert got[(name, "fedsl vectorised")].ratios["fedsl"] > 0
        assert "sequential executor" in got[(name, "fedsl")].settings
        assert "vectorised executor" in got[(name, "fedsl vectorised")].settings
        assert got[(name, "fedsl")].flops > 3 * 12 * 1e6  # the LSTM's FLOPs, not only the dense layer's
    assert "| char_lstm_small | 24.5 | 8.2 |" in rep.markdown()


@pytest.fixture
def conv_workload(monkeypatch):
    """A tiny dropout-free CNN (torch layers only, so worker processes unpickle it without importing this
    module) on 3-channel images, where channels-last changes the convolutions' layout; the smoke sizes."""
    from torch import nn

    def make(num_classes, input_shape):
        c, h, w = input_shape
        return nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(8 * (h // 2) * (w // 2), num_classes))
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")  # an imported factory: opted in
    monkeypatch.setitem(sys.modules, "bench_test_conv", types.SimpleNamespace(make=make))
    monkeypatch.setitem(sys.modules["harness.workloads"].MODEL_SHAPES, "bench_test_conv:make", ((3, 8, 8), 4))
    return replace(workloads(smoke=True)["s2-cifar10+eval"], model="bench_test_conv:make", num_clients=8,
                   clients_per_round=3, samples_per_client=10, batch_size=4, epochs=2, lr=0.1, test_size=16)


# Channels-last convolutions sum in another order than the engine's (which is channels-last too, with its own
# ops): measured differences ~3e-8 after 3 rounds (one float32 ulp at the weights' size); a wrong client,
# batch or mean moves the weights by > 1e-3
CL_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _assert_engines_model(engine, state, w):
    from harness.peers import plain_model
    mine = engine.params()
    assert set(mine) == set(state)
    for n in mine:
        torch.testing.assert_close(state[n], mine[n], **CL_TOLERANCE)
    init = plain_model(w, 0, torch.device("cpu")).state_dict()
    assert max((mine[n] - init[n]).abs().max().item() for n in mine) > 1e-3  # the model moved


def test_loop_channels_last_gives_the_engines_fedavg_model(one_thread, conv_workload):
    """The channels-last plain loop (model, data and batches channels-last) on the engine's clients and batch
    order gives the engine's FedAvg model to float tolerance, evaluating each round."""
    w = conv_workload
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, loop = EnginePeer(w, data, cpu), ChannelsLastLoopPeer(w, data, cpu, share_plan=True)
    for p in (engine, loop):
        p.setup()  # one round
        assert len(p.run(2)) == 2
    conv = loop.models[0][0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    x, _ = loop.client_data[0]
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert loop.x_test.is_contiguous(memory_format=torch.channels_last)
    assert loop.settings.startswith("channels-last") and loop.name != LoopPeer.name
    _assert_engines_model(engine, loop.models[0].state_dict(), w)


def test_loop_per_core_gives_the_engines_fedavg_model_and_stops_its_workers(one_thread, conv_workload):
    """The channels-last loop with the round's clients split over 2 worker processes (started in set-up):
    the engine's FedAvg model to float tolerance, and no worker left once it is closed."""
    from harness.percore import PerCoreLoopPeer
    w = conv_workload
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, loop = EnginePeer(w, data, cpu), PerCoreLoopPeer(w, data, cpu, share_plan=True, workers=2)
    assert loop.pids == []
    try:
        for p in (engine, loop):
            p.setup()  # one round
            assert len(p.run(2)) == 2
        procs = loop.processes
        assert len(procs) == 2 and all(p.is_alive() for p in procs)
        assert "2 worker processes x 1 thread" in loop.settings and loop.extra["startup_once_s"] > 0
        assert loop.extra["actors"] == 2 and loop.extra["actor_peak_mb"] > 0
        assert loop.models[0][0].weight.is_contiguous(memory_format=torch.channels_last)
        _assert_engines_model(engine, loop.models[0].state_dict(), w)
    finally:
        loop.close()
    assert loop.pids == [] and all(not p.is_alive() and p.exitcode is not None for p in procs)
    assert not any(os.path.exists(f"/proc/{p.pid}") for p in procs)
    loop.close()  # idempotent


def test_ratios():
    rows = [Row("a", "fedsl", seconds=1.0), Row("a", "plain loop", seconds=3.0), Row("a", "flower", seconds=5.0),
            Row("b", "fedsl", seconds=2.0), Row("b", "flower", note="skipped")]
    add_ratios(rows)
    assert rows[0].ratios == {"plain loop": 3.0, "flower": 5.0}
    assert rows[1].ratios == {"fedsl": pytest.approx(1 / 3), "flower": pytest.approx(5 / 3)}
    assert rows[3].ratios == {} and rows[4].ratios == {}
    text = markdown(rows)
    assert text.splitlines()[0] == "| " + " | ".join(COLUMNS) + " |"
    assert "3.00x" in text and "5.00x" in text and "skipped" in text
    # the floor: a Scenario-2 CIFAR-10 round's 17.5 GFLOP of training at 74 GFLOP/s
    floor = floors([Row("s2", "fedsl", flops=17.5e9, best_seconds=17.5 / 74), Row("s2", "plain loop", flops=17.5e9,
                                                                                 best_seconds=17.5 / 74)])
    assert floor[-1] == "- s2: 17.5 GFLOP at 74 GFLOP/s = 0.236 s" and len(floor) == 3
    assert floors([Row("a", "fedsl")]) == []


def test_new_loop_peers_are_listed_and_x_plain_loop_stays_todays_loop():
    """loop-cl and loop-percore are peers of the command; the `x plain loop` column is still the plain loop's;
    the per-core peer is CPU-only and not run on an evaluation-only workload (nothing is started here)."""
    from harness.command import parser
    from harness.percore import PerCoreLoopPeer
    from harness.run import PEERS, _make_peers
    assert {"loop", "loop-cl", "loop-percore"} <= set(PEERS)
    helptext = " ".join(parser().format_help().split())
    assert "loop-cl" in helptext and "loop-percore" in helptext
    assert RATIO_PEERS["x plain loop"] == LoopPeer.name == "plain loop"
    assert RATIO_PEERS["x loop cl"] == ChannelsLastLoopPeer.name and RATIO_PEERS["x loop/core"] == PerCoreLoopPeer.name
    w = workloads(smoke=True)
    cpu = torch.device("cpu")
    data = make_data(w["s2-cifar10"])
    loop, cl, per_core = _make_peers(w["s2-cifar10"], data, cpu, ["loop", "loop-cl", "loop-percore"], "auto", 2, 1)
    assert [type(p) for p in (loop, cl, per_core)] == [LoopPeer, ChannelsLastLoopPeer, PerCoreLoopPeer]
    assert len({p.name for p in (loop, cl, per_core)}) == 3 and per_core.available and per_core.pids == []
    assert per_core.workers == min(len(os.sched_getaffinity(0)), w["s2-cifar10"].clients_per_round)
    assert not PerCoreLoopPeer(w["eval-cifar10"], data, cpu).available
    for p in _make_peers(w["s2-cifar10"], data, torch.device("meta"), ["loop-cl", "loop-percore"], "auto", 2, 1):
        assert not p.available and p.why_not == "CPU only"


def test_a_peer_that_fails_is_closed_and_the_next_one_still_runs(one_thread, monkeypatch):
    """A peer whose setup or run raises is reported and closed at once (a process-pool peer's workers stop then,
    not at exit); the peer after one that fails in a repetition still runs that repetition."""
    from harness import run as harness_run

    closed = []

    class Fake:
        available, why_not, settings = True, "", "fake"

        def __init__(self, name, fail_in=None):
            self.name, self.fail_in, self.extra, self.runs = name, fail_in, {}, 0

        def setup(self):
            if self.fail_in == "setup":
                raise RuntimeError("no workers")

        def run(self, rounds):
            self.runs += 1
            if self.fail_in == "run":
                raise RuntimeError("a worker died")
            return [0.01] * rounds

        def close(self):
            closed.append(self.name)

    fakes = [Fake("bad setup", "setup"), Fake("bad run", "run"), Fake("good")]
    monkeypatch.setattr(harness_run, "_make_peers", lambda *a, **k: fakes)
    rep = run_benchmarks(["s1-emnist"], rounds=1, reps=2, smoke=True, footprint_clients=None, threads=1,
                         log=lambda s: None)
    got = {r.peer: r for r in rep.rows}
    assert got["bad setup"].note == "failed: RuntimeError: no workers" and got["bad run"].note.endswith("a worker died")
    assert closed == ["bad setup", "bad run", "good"]  # each once: the failed ones when they failed
    assert fakes[2].runs == 2 and len(got["good"].times) == 2 * timed_rounds(workloads(True)["s1-emnist"], 1)


def test_smoke_run_reports_every_peer_and_column(one_thread):
    names = ["s2-cifar10+eval", "eval-emnist", "s2-cifar10-8seeds+eval"]
    rep = run_benchmarks(names, rounds=1, reps=2, smoke=True, peers=("fedsl", "loop", "loop-cl"),
                         footprint_clients=20, threads=1, log=lambda s: None)
    got = {(r.workload, r.peer): r for r in rep.rows}
    text = rep.markdown()
    for name in names:
        for peer in ("fedsl", "plain loop", "loop channels-last"):
            r = got[(name, peer)]
            assert r.seconds is not None and r.seconds > 0 and len(r.times) == 2 * timed_rounds(
                workloads(True)[name], 1)
            assert r.gflops > 0 and 0 < r.fraction_of_best and r.peak_mb > 0
        f, lp = got[(name, "fedsl")], got[(name, "plain loop")]
        assert f.ratios["plain loop"] == pytest.approx(lp.seconds / f.seconds)
        assert lp.ratios["fedsl"] == pytest.approx(f.seconds / lp.seconds)
        cl = got[(name, "loop channels-last")]
        assert cl.ratios["plain loop"] == pytest.approx(lp.seconds / cl.seconds) and "channels-last" in cl.settings
        line, = (ln for ln in text.splitlines() if ln.startswith(f"| {name} | fedsl | "))
        row = dict(zip(COLUMNS, (c.strip() for c in line.strip("|").split("|"))))
        assert row["x loop cl"] == f"{cl.seconds / f.seconds:.2f}x"
        assert row["x plain loop"] == f"{lp.seconds / f.seconds:.2f}x" and row["x loop/core"] == ""
    stacked = got[("s2-cifar10-8seeds+eval", "fedsl stacked")]
    assert stacked.seconds is not None or "not available" in stacked.note
    assert rep.rows[0].samples == 3 * 12 + 40  # S·n_i training + the test set
    for col in COLUMNS:
        assert col in text
    r = got[("s2-cifar10+eval", "fedsl")]
    assert f"- s2-cifar10+eval: {r.flops / 1e9:.3g} GFLOP at " in text and text.index("Floor per round") > text.index(
        "| s2-cifar10-8seeds+eval |")  # under the table
    assert "small_cnn" in text and "scaffold" in text and "feddyn" in text
    fp = {f["rule"]: f for f in rep.footprint}
    params = fp["scaffold"]["params"]
    # SCAFFOLD: c + c_i for N clients; FedDyn: h + grad_i, float32
    assert fp["scaffold"]["state_mb"] == pytest.approx((20 + 1) * params * 4 / 2 ** 20)
    assert fp["feddyn"]["state_mb"] == pytest.approx((20 + 1) * params * 4 / 2 ** 20)


def test_script_runs_from_the_source_tree(tmp_path):
    out = tmp_path / "r.md"
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--smoke", "--workloads",
                          "eval-cifar10", "--peers", "fedsl,loop", "--reps", "1", "--rounds", "1", "--threads", "1",
                          "--footprint-clients", "0", "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "| eval-cifar10 | fedsl |" in out.read_text()
    from harness.command import main
    assert main(["--workloads", "nope"]) == 2


@pytest.mark.slow
def test_flower_peer_runs_fedavg_rounds(one_thread):
    """Flower's simulation (Ray) on a tiny workload: rounds are timed, start-up is reported apart. One Ray actor
    (the harness's default is 2): its start-up is most of this test's cost, and one checks the same."""
    pytest.importorskip("flwr.simulation")
    pytest.importorskip("ray")  # the bench extra, flwr[simulation]
    from harness.flower_peer import FlowerPeer
    w = replace(workloads(smoke=True)["s2-cifar10+eval"], num_clients=4, clients_per_round=2)
    peer = FlowerPeer(w, make_data(w), torch.device("cpu"), actors=1)
    assert peer.available, peer.why_not
    peer.setup()
    try:
        times = peer.run(2)
    finally:
        peer.close()  # the loggers' levels back, for the tests after this one
    assert len(times) == 2 and all(t > 0 for t in times)
    assert peer.extra["startup_s"] > 0 and peer.extra["actor_peak_mb"] > 0
    assert not FlowerPeer(replace(w, seeds=2), make_data(w), torch.device("cpu")).available


def test_pfl_peer_gives_the_engines_fedavg_model(one_thread):
    """pfl-research's simulation (FederatedAveraging, PyTorchModel, central SGD lr 1) on the engine's
    clients and batch plan (dropout-free model) gives the engine's FedAvg model after 3 rounds, to
    float32 rounding; in its own batch order (pfl slices a client's data in stored order) it runs,
    times its rounds and evaluates centrally; it is listed as the peer ``pfl`` in a benchmark run."""
    import multiprocessing as mp
    pytest.importorskip("pfl")  # the bench extra, pfl[pytorch]
    from harness.pfl_peer import PflPeer
    method = mp.get_start_method(allow_none=True)
    w = replace(workloads(smoke=True)["s2-cifar10+eval"], model="mlp", num_clients=8, clients_per_round=3,
                samples_per_client=10, batch_size=4, epochs=2, lr=0.1, test_size=16)
    data = make_data(w)
    cpu = torch.device("cpu")
    engine, replay, own = EnginePeer(w, data, cpu), PflPeer(w, data, cpu, share_plan=True), PflPeer(w, data, cpu)
    assert mp.get_start_method(allow_none=True) == method  # importing pfl's torch ops changed it: put back
    for p in (engine, replay, own):
        assert p.available, p.why_not
        p.setup()  # one round
        times = p.run(2)
        assert len(times) == 2 and all(t > 0 for t in times)
        p.close()
    mine, theirs = engine.params(), replay.params()
    assert set(mine) == set(theirs)
    for n in mine:
        torch.testing.assert_close(theirs[n], mine[n], rtol=1e-5, atol=1e-6)
    from harness.peers import plain_model
    init = plain_model(w, 0, cpu).state_dict()
    assert max((mine[n] - init[n]).abs().max().item() for n in mine) > 1e-3
    other = own.params()  # pfl's own batch order: another model, moved from the start
    assert max((other[n] - init[n]).abs().max().item() for n in other) > 1e-3
    assert max((other[n] - mine[n]).abs().max().item() for n in other) > 1e-4
    assert 0.0 <= own.accuracy <= 1.0 and own.extra["startup_once_s"] > 0
    assert not PflPeer(replace(w, seeds=2), data, cpu).available
    assert not PflPeer(replace(w, train=False), data, cpu).available

    rep = run_benchmarks(["s2-cifar10+eval", "s1-emnist"], rounds=1, reps=1, smoke=True, peers=("fedsl", "pfl"),
                         footprint_clients=None, threads=1, log=lambda s: None)
    assert sum(row.peer == "pfl" for row in rep.rows) == 2
    for row in rep.rows:
        if row.peer == "pfl":
            assert row.seconds is not None and row.seconds > 0 and "fedsl" in row.ratios, row.note
            assert "pfl 0.6" in row.settings and "(once) not counted" in row.note
    assert "| x pfl |" in rep.markdown() and "pfl" in rep.rows[0].ratios  # fedsl's row: its ratio to pfl


def test_processes_peer_runs_the_pool_executor_and_closes_it(one_thread):
    """The 'processes' peer: fedsl with the process-pool executor, timed beside the sequential one,
    its workers gone when the workload ends."""
    from harness import peers as peer_module
    seen = []
    real_close = peer_module.ProcessesPeer.close
    peer_module.ProcessesPeer.close = lambda self: (seen.append((self.sims[0].executor, self.sims[0].executor.pids)),
                                                    real_close(self))[1]
    try:
        rep = run_benchmarks(["s1-cifar10"], rounds=1, reps=1, smoke=True, peers=("fedsl", "processes"),
                             footprint_clients=None, threads=1, log=lambda s: None)
    finally:
        peer_module.ProcessesPeer.close = real_close
    got = {r.peer: r for r in rep.rows}
    r = got["fedsl processes"]
    assert r.seconds and "processes executor" in r.settings and "worker processes x 1 thread" in r.settings
    assert r.ratios["fedsl"] == pytest.approx(got["fedsl"].seconds / r.seconds)
    (ex, running), = seen
    assert ex.name == "processes" and ex.pids == []  # closed with the workload
    s = workloads(True)["s1-cifar10"].clients_per_round
    assert len(running) == (min(ex.workers, s) if ex.workers > 1 and s > 1 else 0)  # it did use worker processes


def test_profile_round_prints_the_operators_of_a_round(capsys, one_thread):
    import profile_round
    assert profile_round.main(["--workload", "s2-cifar10-fsl", "--smoke", "--threads", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| operator | s per round |" in out and "convolution" in out
    assert profile_round.main(["--workload", "nope"]) == 2
