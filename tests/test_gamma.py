"""γ over the rounds: the schedules by hand, the adaptive rule through the simulator, and the runner's columns."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_federation, run_rounds

from fedsl.algorithms import GammaSchedule, LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.server_round import initial_gamma
from fedsl.config import schema as C
from fedsl.data.federation import Federation
from fedsl.engine.executors import SequentialExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import RunState, Simulator
from fedsl.models import build_model
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------- the schedules, by hand


def test_constant():
    s = GammaSchedule("constant")
    assert [s.value(t, 0.7) for t in (0, 1, 5, 999)] == [0.7] * 4


def test_step():
    s = GammaSchedule("step", every=10, factor=0.5)
    assert [s.value(t, 0.8) for t in (0, 9, 10, 19, 20, 25, 30)] == pytest.approx([0.8, 0.8, 0.4, 0.4, 0.2, 0.2, 0.1])


def test_linear():
    s = GammaSchedule("linear", final=0.2, rounds=5)  # from γ at t = 0 to final at t = T - 1
    assert [s.value(t, 1.0) for t in range(5)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert s.value(10, 1.0) == pytest.approx(0.2)  # stays at final after T
    assert GammaSchedule("linear", final=0.0, rounds=1).value(0, 1.0) == 1.0  # T = 1 does not divide by 0


def test_cosine():
    s = GammaSchedule("cosine", final=0.1, rounds=5)
    half = lambda u: 0.1 + 0.9 * (1 + math.cos(math.pi * u)) / 2  # noqa: E731
    assert [s.value(t, 1.0) for t in range(5)] == pytest.approx([1.0, half(0.25), 0.55, half(0.75), 0.1])
    assert s.value(1, 1.0) == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2)
    assert s.value(9, 1.0) == pytest.approx(0.1)


def test_inv_sqrt():
    s = GammaSchedule("inv_sqrt")
    assert [s.value(t, 2.0) for t in (0, 3, 8, 99)] == pytest.approx([2.0, 1.0, 2 / 3, 0.2])


def test_adaptive_value_is_the_running_gamma():
    s = GammaSchedule("adaptive")
    assert s.value(0, 0.9) == 0.9 and s.value(7, 0.9, 0.3) == 0.3


def test_adaptive_rule():
    s = GammaSchedule("adaptive", threshold=0.1, shrink=0.5)
    assert s.adapt(1.0, 1.0, 0.05) == 0.5  # cos θ below the threshold: shrink
    assert s.adapt(1.0, 1.0, -0.9) == 0.5
    assert s.adapt(1.0, 0.5, float("nan")) == 0.25  # no angle (zero update): shrink
    assert s.adapt(1.0, 0.5, float("inf")) == 0.25
    assert s.adapt(1.0, 0.25, 0.1) == 0.5  # at the threshold counts as agreement: recover by 1/shrink
    assert s.adapt(1.0, 0.5, 0.9) == 1.0
    assert s.adapt(1.0, 1.0, 0.9) == 1.0  # ... up to γ
    assert s.adapt(1.0, 0.8, 0.9) == 1.0
    assert s.adapt(0.6, 0.5, 0.9) == 0.6  # up to this γ
    g, seen = 1.0, []
    for cos in (-1, -1, -1, 1, 1, 1, 1):
        g = s.adapt(1.0, g, cos)
        seen.append(g)
    assert seen == [0.5, 0.25, 0.125, 0.25, 0.5, 1.0, 1.0]
    assert GammaSchedule("adaptive", shrink=0.8).adapt(1.0, 1.0, -0.2) == pytest.approx(0.8)


def test_server_learning_measures_angle_when_asked_or_adaptive():
    assert not ServerLearning(1.0, 0.1, 4, 1).measures_angle
    assert ServerLearning(1.0, 0.1, 4, 1, log_angle=True).measures_angle
    assert ServerLearning(1.0, 0.1, 4, 1, schedule=GammaSchedule("adaptive")).measures_angle
    assert ServerLearning(0.6, 0.1, 4, 1).gamma_schedule == GammaSchedule("constant")


def test_gamma_is_stored_once_in_server_learning():
    """γ is ``ServerLearning.gamma``; the schedule only says how γ_t moves from it, and γ_0 follows it."""
    linear = GammaSchedule("linear", final=0.0, rounds=3)
    assert not hasattr(linear, "gamma")
    assert ServerLearning(0.6, 0.1, 4, 1, schedule=linear).gamma_at(1, None) == pytest.approx(0.3)
    alg = make_algorithm("fedavg", LocalTraining(0.1, 5), 1.0, ServerLearning(0.6, 0.1, 4, 1, schedule=GammaSchedule(
        "adaptive")))
    assert initial_gamma(alg) == 0.6  # the adaptive schedule's running γ starts at γ
    assert initial_gamma(make_algorithm("fedavg", LocalTraining(0.1, 5), 1.0, ServerLearning(0.6, 0.1, 4, 1))) is None


# ---------------------------------------------------------------- through the simulator

SIZES = [9, 17, 12, 14, 10, 16]


def teacher_federation(sizes, server="mirror", num_classes=2, shape=(1, 4, 4), seed=0, dtype=torch.float64):
    """Labels from a random linear teacher; D0 is every client sample ("mirror") or the same samples
    with every label flipped to another class ("flipped": f0 pulls against F)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    w = torch.randn(math.prod(shape), num_classes, generator=g)
    x = torch.randn(n, *shape, generator=g)
    y = (x.flatten(1) @ w).argmax(1)
    bounds = np.cumsum([0, *sizes])
    clients = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    if server == "mirror":
        d0 = np.concatenate(clients)
    else:
        x, y = torch.cat([x, x]), torch.cat([y, (y + 1) % num_classes])
        d0 = np.arange(n, 2 * n)
    xt = torch.randn(40, *shape, generator=g)
    yt = (xt.flatten(1) @ w).argmax(1)
    return Federation(x, y, clients, d0, xt, yt, num_classes, [str(c) for c in range(num_classes)]).to(
        torch.device("cpu"), dtype)


def _sim(fed, server, name="fedavg", model="mlp", lr=0.02, global_lr=1.5, S=3, seed=4):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=2).to(fed.x.dtype))
    alg = make_algorithm(name, LocalTraining(lr, 5), global_lr, server)
    return Simulator(fm, fed, alg, SequentialExecutor(fm), S, seed=seed)


_rounds = run_rounds


def _adaptive(gamma=1.0, threshold=0.0, shrink=0.5, lr=0.1, steps=None):
    return ServerLearning(gamma, lr, 5, 1, steps=steps, schedule=GammaSchedule("adaptive", threshold=threshold,
                                                                                shrink=shrink))


def _follows_rule(sl, st0_gamma, infos, final_gamma):
    sched = sl.gamma_schedule
    assert infos[0].gamma == st0_gamma
    for prev, cur in zip(infos, infos[1:]):
        assert cur.gamma == sched.adapt(sl.gamma, prev.gamma, prev.cos_theta)
    assert final_gamma == sched.adapt(sl.gamma, infos[-1].gamma, infos[-1].cos_theta)
    assert all(-1.0 - 1e-12 <= i.cos_theta <= 1.0 + 1e-12 for i in infos)


def test_adaptive_gamma_follows_the_previous_rounds_angle():
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)  # random labels: the angle wanders
    sl = _adaptive(threshold=0.0)
    st, infos = _rounds(_sim(fed, sl, lr=0.1), 8)
    _follows_rule(sl, 1.0, infos, st.gamma)
    moves = {(b.gamma > a.gamma) - (b.gamma < a.gamma) for a, b in zip(infos, infos[1:])}
    assert {-1, 1} <= moves  # both shrinks and recoveries happened
    assert all(i.server_steps == 2 for i in infos)


def test_server_data_like_the_clients_keeps_gamma():
    """D0 = all clients' samples: -∇f0 = -∇F points where the clients move, cos θ mostly > 0."""
    fed = teacher_federation(SIZES, "mirror")
    sl = _adaptive()
    st, infos = _rounds(_sim(fed, sl), 8)
    _follows_rule(sl, 1.0, infos, st.gamma)
    cos = [i.cos_theta for i in infos]
    assert sum(c > 0 for c in cos) >= 7 and np.mean(cos) > 0.5, cos
    assert sum(i.gamma == 1.0 for i in infos) >= 7
    # and from a shrunk γ it recovers by 1/shrink per agreeing round, up to γ
    st, infos = _rounds(_sim(fed, sl), 4, RunState(st.x, st.algo, 0.25))
    _follows_rule(sl, 0.25, infos, st.gamma)
    assert [i.gamma for i in infos] == [0.25, 0.5, 1.0, 1.0]


def test_adversarial_server_data_shrinks_gamma():
    """D0 = the clients' samples with flipped labels: -∇f0 is an ascent direction of F, γ shrinks."""
    fed = teacher_federation(SIZES, "flipped")
    sl = _adaptive()
    st, infos = _rounds(_sim(fed, sl), 6)
    _follows_rule(sl, 1.0, infos, st.gamma)
    cos = [i.cos_theta for i in infos]
    assert all(c < 0 for c in cos), cos
    assert [i.gamma for i in infos] == [0.5 ** t for t in range(6)]
    assert st.gamma == 0.5 ** 6
    # a constant γ keeps its step, however bad the angle
    const = ServerLearning(1.0, 0.1, 5, 1, log_angle=True)
    _, infos = _rounds(_sim(fed, const), 3)
    assert [i.gamma for i in infos] == [1.0] * 3 and all(i.cos_theta < 0 for i in infos)


def test_cos_theta_by_hand():
    """cos θ_t = <-∇f0(x_t), Δ_t> / (|∇f0(x_t)| |Δ_t|), both at x_t, the model the clients start from.

    For FedAvg Δ_t = mean_i (y_i - x_t) = (x̄_t - x_t)/η_g, with x̄_t the rule's output before SL.
    """
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)
    sim = _sim(fed, ServerLearning(0.7, 0.1, 5, 1, log_angle=True), lr=0.1)
    alone = _sim(fed, None, lr=0.1)
    st = sim.initial_state()
    d0 = torch.from_numpy(fed.server)
    for t in range(3):
        x = {n: p.clone() for n, p in st.x.items()}
        bar, _ = alone.round(RunState(dict(x)), t)
        p = {n: v.clone().requires_grad_(True) for n, v in x.items()}
        loss = F.cross_entropy(torch.func.functional_call(sim.fm.module, p, (fed.x[d0],)), fed.y[d0])
        g0 = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
        delta = {n: bar.x[n] - x[n] for n in x}
        dot = sum(-(g0[n] * delta[n]).sum() for n in x)
        norm = math.sqrt(sum((g0[n] ** 2).sum() for n in x)) * math.sqrt(sum((delta[n] ** 2).sum() for n in x))
        st, info = sim.round(st, t)
        assert info.cos_theta == pytest.approx(float(dot) / norm, abs=1e-10)
        assert info.gamma == 0.7


def test_angle_only_when_asked():
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)
    _, infos = _rounds(_sim(fed, ServerLearning(0.7, 0.1, 5, 1)), 2)
    assert all(i.cos_theta is None and i.gamma == 0.7 for i in infos)
    _, infos = _rounds(_sim(fed, None), 2)
    assert all(i.cos_theta is None and i.gamma is None and i.server_steps == 0 for i in infos)


def test_scheduled_gamma_is_the_server_step():
    """Linear γ from 1 to 0 over T = 3 rounds: the last round's SL step γ_2·η0 = 0 leaves x̄ as is."""
    fed = random_federation(SIZES, n0=10, dtype=torch.float64)
    sl = ServerLearning(1.0, 0.1, 5, 1, schedule=GammaSchedule("linear", final=0.0, rounds=3))
    sim, alone = _sim(fed, sl), _sim(fed, None)
    st, infos = _rounds(sim, 2)
    assert [i.gamma for i in infos] == [1.0, 0.5]
    bar, _ = alone.round(RunState({n: p.clone() for n, p in st.x.items()}), 2)
    st, info = sim.round(st, 2)
    assert info.gamma == 0.0 and info.server_steps == 2
    assert all(torch.equal(st.x[n], bar.x[n]) for n in st.x)
    # while γ_1 = 0.5 did move it
    st1, _ = _rounds(_sim(fed, sl), 1)
    bar, _ = alone.round(RunState({n: p.clone() for n, p in st1.x.items()}), 1)
    st2, _ = sim.round(st1, 1)
    assert not all(torch.equal(st2.x[n], bar.x[n]) for n in st2.x)


# ---------------------------------------------------------------- through the runner: metrics.csv


def _cfg(alg="fsl", rounds=3, **server):
    d = {"name": "g", "rounds": rounds, "seed": 1, "dtype": "float64", "executor": "sequential",
         "data": {"dataset": "synthetic_chars", "chars": "0123", "train_per_class": 30, "test_per_class": 15,
                  "num_clients": 6, "classes_per_client": 2, "server_size": 12},
         "model": {"name": "mlp"},
         "algorithm": {"name": alg, "clients_per_round": 3, "local_lr": 0.05, "batch_size": 8}}
    if server:
        d["server"] = server
    return C.validate(d)


def _metrics(cfg, out):
    """Rows of rounds 1..T (row 0, x_0's accuracy, has no round behind it: no γ, angle or traffic)."""
    run(cfg, out, log=lambda s: None, progress=False)
    rows = RunDir(out).read_metrics()
    assert rows[0]["round"] == 0 and rows[0]["gamma"] is None and rows[0]["comm_params"] is None
    return rows[1:]


def test_runner_writes_gamma_cos_theta_and_comm_columns(tmp_path):
    num = sum(p.numel() for p in build_model("mlp", 4, (1, 28, 28), seed=0).parameters())
    comm = 2 * 3 * num  # S models down and S updates up

    rows = _metrics(_cfg("fsl", log_angle=True), tmp_path / "angle")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["gamma"] == 1.0 and -1 <= r["cos_theta"] <= 1 and r["comm_params"] == comm for r in rows)

    rows = _metrics(_cfg("fsl"), tmp_path / "plain")  # no angle unless asked
    assert all(r["gamma"] == 1.0 and r["cos_theta"] is None for r in rows)

    rows = _metrics(_cfg("fedavg"), tmp_path / "fedavg")  # no server learning: no γ
    assert all(r["gamma"] is None and r["cos_theta"] is None and r["comm_params"] == comm for r in rows)

    rows = _metrics(_cfg("scaffold"), tmp_path / "scaffold")
    assert all(r["comm_params"] == 2 * comm for r in rows)

    # adaptive: the angle is always measured; threshold 1 disagrees every round, so γ halves
    rows = _metrics(_cfg("fsl", gamma_schedule="adaptive", gamma_threshold=1.0), tmp_path / "adaptive")
    assert [r["gamma"] for r in rows] == [1.0, 0.5, 0.25]
    assert all(r["cos_theta"] is not None and -1 <= r["cos_theta"] <= 1 for r in rows)

    rows = _metrics(_cfg("fsl", gamma_schedule="step", gamma_every=1, gamma_factor=0.5, gamma=0.8), tmp_path / "step")
    assert [r["gamma"] for r in rows] == pytest.approx([0.8, 0.4, 0.2])
    assert all(r["cos_theta"] is None for r in rows)

    # SL composed with a baseline logs γ too
    rows = _metrics(_cfg("feddyn", learning="incremental", gamma=0.5, log_angle=True), tmp_path / "feddyn")
    assert all(r["gamma"] == 0.5 and r["cos_theta"] is not None and r["comm_params"] == comm for r in rows)


def test_adaptive_gamma_resumes(tmp_path):
    cfg = _cfg("fsl", rounds=5, gamma_schedule="adaptive", gamma_threshold=0.3)
    quiet = {"log": lambda s: None, "progress": False}
    run(cfg, tmp_path / "full", **quiet)
    run(cfg, tmp_path / "part", stop_after=2, **quiet)
    run(cfg, tmp_path / "part", resume=True, **quiet)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_time"} for r in rs]  # noqa: E731
    full = strip(RunDir(tmp_path / "full").read_metrics())
    assert strip(RunDir(tmp_path / "part").read_metrics()) == full
    assert torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["gamma"] == \
        torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["gamma"]
