"""The process-pool executor (``fedsl.engine.pool``): bit-identical to the sequential executor,
the pool shared once, a dead worker reported in one line (never a hang), workers stopped on close.

One executor (two spawn workers) is shared by the module's tests: starting a worker imports
torch (seconds on a busy 2-core machine).
"""

import os
import pickle
import signal
import threading
import time

import pytest
import torch
from conftest import random_federation

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.algorithms.base import LocalSGD
from fedsl.core import rng
from fedsl.engine.executors import SequentialExecutor, make_executor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.plan import make_plan
from fedsl.engine.pool import ProcessPoolExecutor, _chunks, _dumps
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]  # uneven: clients take 2-4 steps of B = 8


@pytest.fixture(scope="module")
def pool(one_thread):
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).double())
    ex = ProcessPoolExecutor(fm, workers=2)
    yield ex
    ex.close()


def _algorithm(name, **hp):
    server = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1)
    return make_algorithm(name, LocalTraining(0.1, 8), 1.7, server if name == "fsl" else None, **hp)


def _rounds(executor, fm, alg, rounds=3, dtype=torch.float64, shape=(1, 8, 8)):
    fed = random_federation(SIZES, n0=14, dtype=dtype, shape=shape)
    sim = Simulator(fm, fed, alg, executor, clients_per_round=5, seed=11)
    st = sim.initial_state()
    for t in range(rounds):
        st, _ = sim.round(st, t)
    return st


def _two_clients(fed):
    """Round 0's batch plan of clients 0 and 1 (B = 8, one epoch), float64 on the CPU."""
    return make_plan(fed.clients[:2], [0, 1], 8, 1, None, 0, 0, rng.CLIENT_BATCHES).to(torch.device("cpu"),
                                                                                       torch.float64)


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.parametrize("alg, hp", [("fedavg", {}), ("scaffold", {}), ("fednova", {"rho": 0.9}), ("fsl", {})])
def test_rounds_bit_identical_to_sequential(pool, alg, hp):
    """Whole ``Simulator.round``s: the global model, the server state and the clients' state tables
    (SCAFFOLD's c_i), FedNova with local momentum (a carry besides y), FSL's server SGD (local_sgd)."""
    algorithm = _algorithm(alg, **hp)
    a = _rounds(SequentialExecutor(pool.fm), pool.fm, algorithm)
    b = _rounds(pool, pool.fm, algorithm)
    assert _equal(a.x, b.x) and _equal(a.algo, b.algo) and _equal(a.clients, b.clients)
    if alg == "scaffold":
        assert a.clients and any(v.abs().sum() > 0 for g in a.clients.values() for v in g.values())
    assert len(pool.pids) == 2


def test_train_bit_identical_float32_channels_last_with_per_client_lr(pool):
    """Channels-last conv weights and pool (the simulator's CPU layout) keep their strides in the
    workers; per-client η_l (a tensor) is split with the clients; client states and `sent` too.
    Then ``close`` stops the three workers (and may be called again)."""
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=5))
    seq, par = SequentialExecutor(fm), ProcessPoolExecutor(fm, workers=3)
    try:
        fed = random_federation(SIZES, dtype=torch.float32)
        x = fed.x.contiguous(memory_format=torch.channels_last)
        params = {n: p.contiguous(memory_format=torch.channels_last) if p.dim() == 4 else p
                  for n, p in fm.params().items()}
        rule = _algorithm("scaffold").rule
        plan = make_plan(fed.clients, list(range(len(SIZES))), 8, 1, None, 0, 0, rng.CLIENT_BATCHES).to(
            torch.device("cpu"), torch.float32)
        s = plan.num_clients
        states = {k: {n: torch.randn(s, *v.shape) for n, v in g.items()}
                  for k, g in rule.init_client_state(params).items()}
        sent = [{"c": {n: torch.randn_like(v) for n, v in params.items()}}] * s
        lr = torch.linspace(0.05, 0.2, s)
        a = seq.train(rule, [params] * s, plan, x, fed.y, lr, states, sent)
        b = par.train(rule, [params] * s, plan, x, fed.y, lr, states, sent)
        assert _equal(a[0], b[0]) and _equal(a[1], b[1])
        assert any(v.dim() == 5 and v[0].is_contiguous(memory_format=torch.channels_last) for v in b[0].values())
        assert len(par.pids) == 3
        procs = [w.process for w in par._procs]
        par.close()
        assert par.pids == [] and all(not p.is_alive() for p in procs)
        par.close()  # idempotent
    finally:
        par.close()


def test_local_sgd_and_single_client_calls(pool):
    """local_sgd (pretraining, server learning) with several clients goes to the workers, with one
    client it runs in the caller; both equal the sequential executor's."""
    fed = random_federation(SIZES)
    params = pool.fm.params()
    seq = SequentialExecutor(pool.fm)
    for clients in ([0, 1, 2, 3], [5]):
        plan = make_plan([fed.clients[i] for i in clients], clients, 8, 2, None, 1, 2, rng.PRETRAIN).to(
            torch.device("cpu"), torch.float64)
        assert _equal(seq.local_sgd(params, plan, fed.x, fed.y, 0.1), pool.local_sgd(params, plan, fed.x, fed.y, 0.1))


def test_pool_is_shared_once_and_again_only_when_another_is_passed(pool, monkeypatch):
    fed = random_federation(SIZES)
    params = pool.fm.params()
    plan = make_plan(fed.clients[:4], [0, 1, 2, 3], 8, 1, None, 1, 0, rng.CLIENT_BATCHES).to(
        torch.device("cpu"), torch.float64)
    import fedsl.engine.pool as pool_module
    sent = []

    class Counting(pool_module.ForkingPickler):  # the pool's message is the only one pickled this way
        @classmethod
        def dumps(cls, obj, protocol=None):
            sent.append(obj[0])
            return super().dumps(obj, protocol)

    monkeypatch.setattr(pool_module, "ForkingPickler", Counting)
    first = pool.local_sgd(params, plan, fed.x, fed.y, 0.1)
    assert fed.x.is_shared() and fed.y.is_shared()  # moved into shared memory in place, not copied
    pool.local_sgd(params, plan, fed.x, fed.y, 0.1)
    assert sent.count("pool") == 2  # one per worker, on the first call only
    other = random_federation(SIZES, seed=1)
    assert not _equal(first, pool.local_sgd(params, plan, other.x, other.y, 0.1))
    assert sent.count("pool") == 4


def test_messages_keep_strides_and_values():
    from fedsl.engine.pool import _rebuild  # noqa: F401 - the name pickled messages refer to
    t = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    cases = [t, t[1:], t.expand(3, 2, 3, 4, 5)[0], torch.zeros(0, 3), torch.tensor(2.5), torch.arange(6)[::2],
             torch.randn(4).to(torch.bfloat16), torch.tensor([True, False])]
    for c in cases:
        back = pickle.loads(_dumps(c))
        assert torch.equal(back, c) and back.dtype == c.dtype
    assert pickle.loads(_dumps(t)).stride() == t.stride()


def test_algorithms_are_picklable():
    from fedsl.algorithms import SPECS
    server = ServerLearning(gamma=0.8, lr=0.05, batch_size=6, epochs=1)
    for name, spec in SPECS.items():  # a rule that is a form of server learning takes it (its spec says so)
        alg = make_algorithm(name, LocalTraining(0.1, 8), 1.0, server if spec.server_learning != "off" else None)
        back = pickle.loads(pickle.dumps(alg))
        assert back == alg and type(back.rule) is type(alg.rule)


def test_chunks_are_contiguous_non_empty_and_balanced_by_steps():
    assert _chunks((5,) * 10, 2) == [(0, 5), (5, 10)]
    assert _chunks((1, 9, 1, 1), 2) == [(0, 2), (2, 4)]
    assert _chunks((3, 3), 5) == [(0, 1), (1, 2)]
    assert _chunks((4,), 2) == [(0, 1)]
    for steps in [(1,) * 7, (2, 0, 5, 1, 1, 9, 3), (0, 0, 0)]:
        for parts in (1, 2, 3, 4):
            c = _chunks(steps, parts)
            assert c[0][0] == 0 and c[-1][1] == len(steps) and all(a < b for a, b in c)
            assert all(c[i][1] == c[i + 1][0] for i in range(len(c) - 1)) and len(c) == min(parts, len(steps))


def _big_call(ex):
    """A call that keeps the workers busy for seconds (many steps of a CIFAR-sized CNN)."""
    fed = random_federation([400] * 4, shape=(3, 32, 32), dtype=torch.float32)
    plan = make_plan(fed.clients, [0, 1, 2, 3], 4, 5, None, 0, 0, rng.CLIENT_BATCHES).to(
        torch.device("cpu"), torch.float32)
    return lambda: ex.local_sgd(ex.fm.params(), plan, fed.x, fed.y, 0.01)


def test_worker_killed_mid_round_is_a_one_line_error_then_a_fresh_pool(one_thread):
    fm = FunctionalModel(build_model("cifar_cnn", 10, (3, 32, 32), seed=0))
    ex = ProcessPoolExecutor(fm, workers=2)
    try:
        fed = random_federation(SIZES, dtype=torch.float32, shape=(3, 32, 32))
        small = make_plan(fed.clients[:2], [0, 1], 8, 1, None, 0, 0, rng.CLIENT_BATCHES).to(
            torch.device("cpu"), torch.float32)
        ex.local_sgd(fm.params(), small, fed.x, fed.y, 0.01)  # workers up
        victim = ex.pids[1]
        killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            _big_call(ex)()
        killer.join()
        msg = str(err.value)
        assert "\n" not in msg and f"worker process {victim} died (SIGKILL" in msg and "clients 2..3" in msg, msg
        assert time.monotonic() - t0 < 60 and ex.pids == []  # the other worker was stopped too
        # the next call starts a new pool and computes what the sequential executor does
        got = ex.local_sgd(fm.params(), small, fed.x, fed.y, 0.01)
        assert _equal(got, SequentialExecutor(fm).local_sgd(fm.params(), small, fed.x, fed.y, 0.01))
        # killed between calls: reported at the next call, not a hang on a dead pipe
        os.kill(ex.pids[0], signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(RuntimeError, match="died .*between rounds"):
            ex.local_sgd(fm.params(), small, fed.x, fed.y, 0.01)
    finally:
        ex.close()


def test_collection_stops_the_workers(one_thread):
    """An executor dropped without ``close``: its finaliser stops the workers (``close`` itself is checked at
    the end of the float32 test, on that test's three workers)."""
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).double())
    fed = random_federation(SIZES)
    plan = _two_clients(fed)
    ex2 = ProcessPoolExecutor(fm, workers=2)
    ex2.local_sgd(fm.params(), plan, fed.x, fed.y, 0.1)
    procs = [w.process for w in ex2._procs]
    del ex2  # garbage-collected: the finaliser stops its workers
    import gc
    gc.collect()
    assert all(not p.is_alive() for p in procs)


class Failing(LocalSGD):
    """A client whose step fails (as a bug in a user's algorithm would), in the worker."""

    def client_step(self, carry, aux, g, lr):
        raise ValueError("client step failed on purpose")


def test_worker_exception_is_raised_in_the_caller_and_the_pool_goes_on(pool):
    fed = random_federation(SIZES)
    plan = _two_clients(fed)
    params = pool.fm.params()
    with pytest.raises(ValueError, match="client step failed on purpose"):
        pool.train(Failing(), [params, params], plan, fed.x, fed.y, 0.1)
    assert _equal(pool.local_sgd(params, plan, fed.x, fed.y, 0.1),
                  SequentialExecutor(pool.fm).local_sgd(params, plan, fed.x, fed.y, 0.1))


def test_make_executor_names_and_bad_input():
    fm = FunctionalModel(build_model("linear", 2, (1, 2, 2), seed=0))
    ex = make_executor("processes", fm, torch.device("cpu"))
    assert ex.name == "processes" and ex.workers >= 1 and ex.pids == []  # nothing started before a call
    with pytest.raises(ValueError, match="runs on CPU"):
        make_executor("processes", fm, torch.device("cuda"))
    with pytest.raises(ValueError, match="workers = 0"):
        ProcessPoolExecutor(fm, workers=0)
    with pytest.raises(ValueError, match="executor = 'gpu'.*processes"):
        make_executor("gpu", fm, torch.device("cpu"))


def test_a_run_with_executor_processes_equals_sequential_and_stops_its_workers(tmp_path, one_thread, monkeypatch):
    """``executor = "processes"`` in a config (threads = 1): the run's history equals the sequential
    executor's bit for bit, and the run closes its workers when it ends."""
    import csv

    from conftest import TINY

    import fedsl.engine.pool as pool_module
    from fedsl.config import loading
    from fedsl.runs.runner import run

    monkeypatch.setattr(pool_module, "default_workers", lambda: 2)  # a 1-core CI machine too
    closed = []
    real_close = pool_module.ProcessPoolExecutor.close
    monkeypatch.setattr(pool_module.ProcessPoolExecutor, "close",
                        lambda self: (closed.append(list(self.pids)), real_close(self))[1])
    out = {}
    for ex in ("sequential", "processes"):
        p = tmp_path / f"{ex}.toml"
        p.write_text(TINY.format(rounds=3, alg="scaffold", dtype="float64", executor=ex).replace(
            'executor = "', 'threads = 1\nexecutor = "'))
        s = run(loading.load(p), tmp_path / ex, log=lambda m: None, progress=False)
        assert s["status"] == "completed" and s["executor"] == ex
        rows = list(csv.DictReader((tmp_path / ex / "metrics.csv").open()))
        out[ex] = [{k: v for k, v in r.items() if "time" not in k and "wall" not in k} for r in rows]
    assert out["sequential"] == out["processes"] and len(out["sequential"]) >= 1
    assert len(closed) == 1 and len(closed[0]) == 2  # the run started 2 workers and closed them


def test_a_pool_too_big_for_shared_memory_is_a_one_line_error(one_thread, monkeypatch):
    import fedsl.engine.pool as pool_module
    monkeypatch.setattr(pool_module, "shm_free", lambda: 1000)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), seed=3).double())
    fed = random_federation(SIZES)
    plan = _two_clients(fed)
    with ProcessPoolExecutor(fm, workers=2) as ex:
        with pytest.raises(ValueError, match=r"does not fit in shared memory \(/dev/shm has 0 MiB free\)") as err:
            ex.local_sgd(fm.params(), plan, fed.x, fed.y, 0.1)
        assert "\n" not in str(err.value) and not fed.x.is_shared() and ex.pids == []


def test_a_model_that_cannot_be_pickled_is_a_one_line_error(one_thread):
    model = build_model("small_cnn", 4, (1, 8, 8), seed=3).double()
    model.hook = lambda t: t  # a lambda attribute: pickle cannot send it to a worker
    fm = FunctionalModel(model)
    fed = random_federation(SIZES)
    plan = _two_clients(fed)
    with ProcessPoolExecutor(fm, workers=2) as ex:
        with pytest.raises(ValueError, match="the model cannot be sent to worker processes .*'sequential'") as err:
            ex.local_sgd(fm.params(), plan, fed.x, fed.y, 0.1)
        assert "\n" not in str(err.value) and ex.pids == []


def test_a_client_class_the_workers_cannot_import_is_a_one_line_error(pool):
    """A rule defined where spawned workers cannot import it (here: a module made at run time)."""
    import sys
    import types
    mod = types.ModuleType("made_at_run_time")
    exec("from fedsl.algorithms.base import LocalSGD\nclass Mine(LocalSGD):\n    pass\n", mod.__dict__)
    sys.modules["made_at_run_time"] = mod
    try:
        fed = random_federation(SIZES)
        plan = _two_clients(fed)
        params = pool.fm.params()
        with pytest.raises(RuntimeError, match="could not read its share of the round .*made_at_run_time") as err:
            pool.train(mod.Mine(), [params, params], plan, fed.x, fed.y, 0.1)
        assert "\n" not in str(err.value) and pool.pids == []
    finally:
        del sys.modules["made_at_run_time"]


def test_a_model_the_workers_cannot_import_fails_at_start_in_one_line(one_thread):
    import sys
    import types
    mod = types.ModuleType("model_made_at_run_time")
    exec("from torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
         "        self.fc = nn.Linear(64, 4)\n    def forward(self, x):\n        return self.fc(x.flatten(1))\n",
         mod.__dict__)
    sys.modules["model_made_at_run_time"] = mod
    try:
        fm = FunctionalModel(mod.Net().double())
        fed = random_federation(SIZES)
        plan = _two_clients(fed)
        with ProcessPoolExecutor(fm, workers=2) as ex:
            with pytest.raises(ValueError, match="could not load the model .*model_made_at_run_time") as err:
                ex.local_sgd(fm.params(), plan, fed.x, fed.y, 0.1)
            assert "\n" not in str(err.value) and ex.pids == []
    finally:
        del sys.modules["model_made_at_run_time"]
