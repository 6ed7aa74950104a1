"""The clients' states kept only where they exist (``fedsl.engine.client_state``): a sparse store holds rows for the
clients sampled so far and equals the dense [N, ...] tables bit for bit (SCAFFOLD, FedDyn, MOON; one run and stacked
runs; through a checkpoint and a kill -9); float16 rows stay within float16's rounding; a store on disk keeps its file
in the run's folder; its memory follows the clients seen, not N."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import random_federation, run_rounds

from fedsl.algorithms import LocalTraining, ServerLearning, make_algorithm
from fedsl.config import schema as C
from fedsl.data.clients import ClientIndex
from fedsl.engine import client_state as cs
from fedsl.engine.client_state import CHUNK, STORE_FILE, ClientStore, StoreSettings
from fedsl.engine.executors import SequentialExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.engine.stacked import StackedSimulator
from fedsl.models import build_model
from fedsl.runs import checkpoint, placement
from fedsl.runs.callbacks import Callback
from fedsl.runs.checkpoint import Checkpoint
from fedsl.runs.runner import RunSession, run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20]
RULES = {"scaffold": (1.7, {}), "feddyn": (None, {"alpha": 0.1}), "moon": (1.0, {"moon_mu": 1.0, "moon_tau": 0.5})}
SPARSE = StoreSettings("sparse")
QUIET = {"log": lambda s: None, "progress": False}


def _sim(name, fed, store, *, seed=11, lr=0.1, model="mlp", gamma=0.8):
    fm = FunctionalModel(build_model(model, fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    eta_g, hp = RULES[name]
    sl = ServerLearning(gamma=gamma, lr=0.05, batch_size=6, epochs=1, mode="incremental")
    alg = make_algorithm(name, LocalTraining(lr, 8), eta_g, sl, **hp)
    return Simulator(fm, fed, alg, SequentialExecutor(fm), 3, seed=seed, client_store=store)


def _same(dense, sparse, num_clients):
    """The two runs' models, server states and every client's state (a sparse store's gathered) are equal."""
    assert all(torch.equal(dense.x[n], sparse.x[n]) for n in dense.x)
    assert all(torch.equal(dense.algo[k][n], sparse.algo[k][n]) for k in dense.algo for n in dense.algo[k])
    rows = sparse.clients.gather(np.arange(num_clients))
    assert rows.keys() == dense.clients.keys()
    for k, g in dense.clients.items():
        for n, table in g.items():
            assert torch.equal(rows[k][n], table) and rows[k][n].stride() == table.stride(), f"{k}.{n}"


@pytest.mark.parametrize("name,model", [("scaffold", "mlp"), ("feddyn", "mlp"), ("moon", "small_cnn")])
def test_sparse_store_equals_dense_tables_bit_for_bit(name, model):
    """One run and a stack of two (different seeds and η_l), with server learning, from dense tables and from a
    sparse store: the same numbers to the last bit, and the store holds exactly the clients sampled."""
    fed = random_federation(SIZES, dtype=torch.float32)
    dense, infos = run_rounds(_sim(name, fed, StoreSettings(), model=model), 4)
    sparse, _ = run_rounds(_sim(name, fed, SPARSE, model=model), 4)
    _same(dense, sparse, len(SIZES))
    seen = {int(i) for info in infos for i in info.clients}
    assert sorted(sparse.clients.ids.tolist()) == sorted(seen) and len(seen) < len(SIZES)  # one never sampled

    def stack(store):
        sims = [_sim(name, fed, store, model=model), _sim(name, fed, store, model=model, seed=5, lr=0.05)]
        stacked = StackedSimulator(sims)
        states = stacked.initial_states()
        for t in range(3):
            states, _ = stacked.round(states, t)
        return states
    for d, s in zip(stack(StoreSettings()), stack(SPARSE)):
        _same(d, s, len(SIZES))


def _template(width=10):
    return {"c_i": {"w": torch.zeros(width // 2, 2)}}


def test_store_memory_follows_the_clients_seen_not_n():
    """N = 10^6 clients declared, 30 sampled over three rounds: 30 rows held, the first chunk allocated, whatever N;
    a client never sampled reads the initial row; growing past the chunk keeps every row."""
    n, gen = 10**6, np.random.default_rng(0)
    store = ClientStore(_template(), n, "cpu", torch.float32)
    written = {}
    for _ in range(3):
        ids = gen.choice(n, 10, replace=False)
        rows = torch.randn(10, 5, 2)
        store.scatter(ids, {"c_i": {"w": rows}})
        written.update(zip(ids.tolist(), rows))
    assert store.rows_held == len(written) == 30 and store.capacity == CHUNK
    assert store.nbytes == CHUNK * 10 * 4  # rows of the clients seen: nothing per declared client
    ids = list(written)[:4] + [n - 1]
    got = store.gather(ids)["c_i"]["w"]
    assert all(torch.equal(got[j], written[i]) for j, i in enumerate(ids[:4])) and not got[4].any()
    more = np.setdiff1d(np.arange(200), list(written))[:100]
    store.scatter(more, {"c_i": {"w": torch.ones(100, 5, 2)}})
    assert store.rows_held == 130 and store.capacity == max(130, 2 * CHUNK)  # what it needs, or twice what it had
    assert all(torch.equal(store.gather([i])["c_i"]["w"][0], v) for i, v in written.items())
    with pytest.raises(ValueError, match="expected ids in 0..999999"):
        store.scatter([n], {"c_i": {"w": torch.ones(1, 5, 2)}})


def test_a_million_clients_declared_hold_the_rows_of_those_sampled():
    """A SCAFFOLD run over N = 10^6 clients (each one of 8 small clients' index arrays, shared): three rounds of
    S = 10 hold 30 rows (dense tables would hold 10^6 × d)."""
    small = random_federation([3] * 8, dtype=torch.float32)
    reps = 10**6 // 8  # the 8 clients' index arrays repeated, as one ClientIndex (CSR) of 10^6 clients
    fed = replace(small, clients=ClientIndex(np.arange(0, 3 * 8 * reps + 1, 3), np.tile(small.clients.indices, reps)))
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3))
    alg = make_algorithm("scaffold", LocalTraining(0.1, 8), 1.0, None)
    sim = Simulator(fm, fed, alg, SequentialExecutor(fm), 10, seed=5, client_store=SPARSE)
    st, infos = run_rounds(sim, 3)
    sampled = {int(i) for info in infos for i in info.clients}
    assert fed.num_clients == 10**6 and st.clients.rows_held == len(sampled) == 30
    assert st.clients.nbytes == CHUNK * sum(p.numel() for p in st.x.values()) * 4


def test_float16_rows_within_rounding_and_overflow_refused():
    """float16 rows: each number within half a unit in float16's last place of the value written (relative 2^-11,
    absolute 2^-25 below 2^-14); a value beyond float16's range is refused in one line, not stored as inf."""
    store = ClientStore(_template(), 100, "cpu", torch.float16)
    values = torch.randn(20, 5, 2, dtype=torch.float64) * 10.0 ** torch.randint(-9, 5, (20, 5, 2))
    store.scatter(np.arange(20), {"c_i": {"w": values.float()}})
    got = store.gather(np.arange(20))["c_i"]["w"]
    assert got.dtype == torch.float32 and store.nbytes == CHUNK * 10 * 2
    err = (got.double() - values.float().double()).abs()
    assert bool((err <= cs.float16_error_bound(values.float())).all()) and err.max() > 0  # lossy, as said
    with pytest.raises(ValueError, match=r"beyond float16's range .*client_state.dtype = 'auto'") as e:
        store.scatter([3], {"c_i": {"w": torch.full((1, 5, 2), 1e5)}})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype,on_disk", [(torch.float32, False), (torch.float16, False), (torch.float32, True)])
def test_checkpoint_round_trip(tmp_path, dtype, on_disk):
    """A store saved in a checkpoint and placed back (in memory or in a file) reads the same rows; a store on disk
    writes its rows from its file."""
    path = tmp_path / "run" / STORE_FILE if on_disk else None
    store = ClientStore(_template(), 50, "cpu", dtype, path)
    ids = np.array([7, 3, 41, 19])
    store.scatter(ids, {"c_i": {"w": torch.randn(4, 5, 2)}})
    checkpoint.save(tmp_path / "ckpt.pt", Checkpoint(2, _run_state(store)))
    back = checkpoint.load(tmp_path / "ckpt.pt", mmap=on_disk).state.clients
    assert isinstance(back, cs.SavedStore) and back.ids.tolist() == ids.tolist() and back.dtype == dtype
    again = ClientStore.restore(back, 50, "cpu", torch.float32, "cpu", tmp_path / "other" / STORE_FILE
                                if on_disk else None)
    probe = [3, 7, 19, 41, 0]
    assert torch.equal(again.gather(probe)["c_i"]["w"], store.gather(probe)["c_i"]["w"])
    assert on_disk == (tmp_path / "other" / STORE_FILE).is_file()


def _run_state(store):
    from fedsl.algorithms.base import RunState
    return RunState({"w": torch.zeros(3)}, {}, None, store)


def _cfg(**store):
    """SCAFFOLD with server learning on 6 clients, 7 rounds, a checkpoint every 3."""
    return C.validate({
        "name": "tiny", "rounds": 7, "seed": 3, "checkpoint_every": 3, "executor": "sequential",
        "data": {"dataset": "synthetic_chars", "chars": "0123", "train_per_class": 30, "test_per_class": 15,
                 "num_clients": 6, "classes_per_client": 2, "server_size": 12},
        "model": {"name": "mlp"}, "algorithm": {"name": "scaffold", "clients_per_round": 2, "local_lr": 0.05,
                                                 "batch_size": 8},
        "server": {"learning": "incremental"}, "client_state": store})


class Killed(BaseException):
    """A kill -9 after a round: nothing more is written (no checkpoint, no summary)."""


class KillAfter(Callback):
    """Kills the run after round ``round_``; records, at each round's end, the store files under ``root``."""

    def __init__(self, round_, root):
        self.round, self.root, self.files = round_, root, []

    def on_round_end(self, round, metrics):
        self.files.append(sorted(self.root.rglob(STORE_FILE)))
        if round == self.round:
            raise Killed


def test_store_on_disk_resumes_after_a_kill_bit_identically(tmp_path, monkeypatch):
    """SCAFFOLD with its clients' states in a file: killed after round 5 (its last checkpoint of round 3, the file
    two rounds ahead of it), resumed, it ends as the run that never stopped and as the dense run, bit for bit; the
    file lives in the run's folder while the run does, and nowhere else."""
    dense = run(_cfg(), tmp_path / "dense", **QUIET)
    full = run(_cfg(store="sparse", on_disk=True), tmp_path / "full", **QUIET)
    assert full["final_accuracy"] == dense["final_accuracy"]

    killed = tmp_path / "killed"
    finish = RunSession.finish
    monkeypatch.setattr(RunSession, "finish", lambda self, status: None)  # killed: no last checkpoint, no summary
    kill = KillAfter(5, tmp_path)
    with pytest.raises(Killed):
        run(_cfg(store="sparse", on_disk=True), killed, callbacks=[kill], **QUIET)
    monkeypatch.setattr(RunSession, "finish", finish)
    assert kill.files == [[killed / STORE_FILE]] * 5 and checkpoint.read_round(killed / "checkpoint.pt") == 3
    assert not (killed / "summary.json").is_file() or json.loads((killed / "summary.json").read_text())[
        "status"] != "completed"

    resumed = run(_cfg(store="sparse", on_disk=True), killed, resume=True, **QUIET)
    assert resumed["final_accuracy"] == full["final_accuracy"]
    a, b = checkpoint.load(tmp_path / "dense" / "checkpoint.pt"), checkpoint.load(killed / "checkpoint.pt")
    assert a.round == b.round == 7 and all(torch.equal(a.state.x[n], b.state.x[n]) for n in a.state.x)
    assert all(torch.equal(a.state.algo["c"][n], b.state.algo["c"][n]) for n in a.state.algo["c"])
    assert (killed / "metrics.csv").read_text().count("\n") == (tmp_path / "dense" / "metrics.csv").read_text().count(
        "\n")
    assert [p.name for p in tmp_path.rglob(STORE_FILE)] == []  # a finished run's file is gone: nothing reads it


def test_resume_with_another_store_is_refused(tmp_path):
    run(_cfg(store="sparse"), tmp_path / "r", stop_after=3, **QUIET)
    with pytest.raises(C.ConfigError, match=r"as a sparse store: expected client_state.store as the run started "
                                            r"with, not 'dense'"):
        run(_cfg(), tmp_path / "r", resume=True, **QUIET)


def test_memory_plans_count_the_rows_the_store_can_hold():
    """Dense: N rows; sparse: min(N, S·T), halved in float16; on disk: none in memory; stateless: none."""
    from fedsl.algorithms import SPECS
    sp, d = SPECS["scaffold"], 1000
    assert placement.client_state_bytes(_cfg(), sp, 6, d) == 6 * d * 4
    assert placement.client_state_bytes(_cfg(store="sparse"), sp, 10**6, d) == 2 * 7 * d * 4
    assert placement.client_state_bytes(_cfg(store="sparse", dtype="float16"), sp, 10**6, d) == 2 * 7 * d * 2
    assert placement.client_state_bytes(_cfg(store="sparse", on_disk=True), sp, 10**6, d) == 0
    assert placement.client_state_bytes(_cfg(store="sparse"), SPECS["fedavg"], 10**6, d) == 0


@pytest.mark.parametrize("store,expected", [
    ({"store": "sparce"}, "client_state.store = 'sparce': Input should be 'dense' or 'sparse'"),
    ({"dtype": "float16"}, "client_state.dtype = 'float16' sets the numbers of a sparse store: expected "
                           "client_state.store = 'sparse', or dtype = 'auto'"),
    ({"store": "sparse", "dtype": "bfloat16"}, "client_state.dtype = 'bfloat16': Input should be 'auto' or 'float16'"),
    ({"on_disk": True}, "client_state.on_disk = true keeps a sparse store's rows in a file: expected "
                        "client_state.store = 'sparse'"),
])
def test_bad_store_settings_are_one_line_errors(store, expected):
    with pytest.raises(C.ConfigError) as e:
        _cfg(**store)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
    with pytest.raises(C.ConfigError, match="expected client_tables = 'auto' or 'host', not 'device'"):
        C.validate({**_cfg(store="sparse", on_disk=True).model_dump(), "client_tables": "device"})
