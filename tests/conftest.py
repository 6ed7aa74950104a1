import contextlib
import gzip
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

# Before numpy loads OpenBLAS (the test processes' subprocesses inherit it): the fonts' small blur products gain
# nothing from a second BLAS thread, and on a busy machine two threads waiting on each other cost several times the
# work (the same bytes either way)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers share the machine's cores (more workers than cores, beside the processes the service tests
    # start): an op's second thread only waits, spinning, for a core another worker holds. One intra-op thread per
    # worker; a test that needs more sets them itself (and restores them).
    torch.set_num_threads(1)

from fedsl.data.federation import Federation
from fedsl.sources.idx import IDX_DTYPES


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Generated datasets are cached in a per-session folder, never in the user's home. Under pytest-xdist
    the session's workers share it (their base folders sit side by side in the session's): each dataset is
    decoded once, by whichever worker wants it first (``cached_arrays`` locks an entry while it is built)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent / "fedsl-cache" if os.environ.get("PYTEST_XDIST_WORKER") else base / "fedsl-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDSL_CACHE", str(folder))
        yield


@contextlib.contextmanager
def environment_restored():
    """os.environ as it was before the block, whatever the block (or a library it imports) set or removed."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def _no_environment_leaks():
    """No test leaves its environment to the next: e.g. importing flwr.simulation sets
    RAY_ENABLE_UV_RUN_RUNTIME_ENV for the rest of the process."""
    with environment_restored():
        yield


def random_federation(sizes, n0=12, num_classes=4, shape=(1, 8, 8), dtype=torch.float64, seed=0,
                      n_test=40) -> Federation:
    """A small federation of random images; client i holds ``sizes[i]`` samples."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes) + n0
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, num_classes, (n,), generator=g)
    bounds = np.cumsum([0, *sizes])
    clients = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    server = np.arange(bounds[-1], n)
    xt = torch.randn(n_test, *shape, generator=g)
    yt = torch.randint(0, num_classes, (n_test,), generator=g)
    return Federation(x, y, clients, server, xt, yt, num_classes, [str(c) for c in range(num_classes)]).to(
        torch.device("cpu"), dtype)


def stacked_and_alone(make_sims, rounds: int):
    """``rounds`` rounds of the runs ``make_sims()`` builds, stacked (``StackedSimulator``) and each alone: per run
    (stacked state, stacked (accuracy, loss), the state alone, the simulator alone)."""
    from fedsl.engine.stacked import StackedSimulator
    stacked = StackedSimulator(make_sims())
    states = stacked.initial_states()
    for t in range(rounds):
        states, _ = stacked.round(states, t)
    evals = stacked.evaluate([s.x for s in states])
    return [(states[r], evals[r], run_rounds(sim, rounds)[0], sim) for r, sim in enumerate(make_sims())]


def random_text_federation(sizes, n0=12, length=10, vocab=80, seed=0, n_test=40) -> Federation:
    """A small federation of random text windows (uint8 character indices [n, length]); client i holds
    ``sizes[i]`` windows, each labelled with a next character."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes) + n0
    x = torch.randint(0, vocab, (n, length), generator=g, dtype=torch.uint8)
    y = torch.randint(0, vocab, (n,), generator=g)
    bounds = np.cumsum([0, *sizes])
    clients = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    xt = torch.randint(0, vocab, (n_test, length), generator=g, dtype=torch.uint8)
    yt = torch.randint(0, vocab, (n_test,), generator=g)
    return Federation(x, y, clients, np.arange(bounds[-1], n), xt, yt, vocab, [str(c) for c in range(vocab)])


# A `fedsl` process that pauses, interruptibly, at a point of its work, and says so in the file READY: a test
# signals or kills it only then. A poll of the run's files instead races the run on a loaded machine (the run may
# finish first). AT: "round:N", right after its first run records round N (its metrics.csv row written, a
# checkpoint there if one was due); "unit:K", before the K-th unit of its group starts (0: group.json written,
# no run begun; 1: the first run finished, the next not begun).
PAUSED_FEDSL = """
import pathlib, sys, time
from fedsl.cli import main
from fedsl.sweeps import compare
from fedsl.runs import runner
ready, (kind, at) = pathlib.Path(sys.argv.pop(1)), sys.argv.pop(1).split(":")
at = int(at)
def pause():
    if not ready.exists():
        ready.write_text(str(at))
        PAUSE
if kind == "round":
    record = runner.RunSession.record
    def paused(self, t, *args, **kwargs):
        ok = record(self, t, *args, **kwargs)
        if t + 1 == at:
            pause()
        return ok
    runner.RunSession.record = paused
else:
    run_unit, started = compare.run_unit, []
    def paused(*args, **kwargs):
        if len(started) == at:
            pause()
        started.append(1)
        return run_unit(*args, **kwargs)
    compare.run_unit = paused
sys.exit(main(sys.argv[1:]))
"""


def start_paused(args: list[str], ready: Path, at: str, pause: str = "while True: time.sleep(0.05)",
                 **popen) -> subprocess.Popen:
    """``fedsl ARGS`` in a child process that pauses at ``at`` ("round:N" or "unit:K", ``PAUSED_FEDSL``;
    ``pause``: the statement it pauses with), and waits until it does (or ends, or 120 s pass)."""
    code = PAUSED_FEDSL.replace("PAUSE", pause)
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready), at, *args], **popen)
    deadline = time.time() + 120
    while time.time() < deadline and not ready.is_file() and proc.poll() is None:
        time.sleep(0.02)
    return proc


def shared_data_dir():
    """The offline datasets (../shared/data from the repo, or $FEDSL_SHARED_DATA)."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return Path(os.environ.get("FEDSL_SHARED_DATA", default))


@pytest.fixture
def shared_data():
    d = shared_data_dir()
    if not d.is_dir():
        pytest.skip(f"offline datasets not found at {d} (set FEDSL_SHARED_DATA to run this test)")
    return d


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two busy-waiting
    threads made a module 10x slower; the previous setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def clone_state(st):
    """A deep copy of a RunState: ``Simulator.round`` writes the sampled rows of the clients' tables in place."""
    from fedsl.algorithms.base import RunState

    def copy(group):
        return {k: {n: p.clone() for n, p in v.items()} for k, v in group.items()}

    return RunState({n: p.clone() for n, p in st.x.items()}, copy(st.algo), st.gamma, copy(st.clients))


def flat_state(st) -> dict:
    """Every tensor of a RunState by a flat name: x.NAME, KEY.NAME (server state), clients.KEY.NAME."""
    out = {f"x.{n}": p for n, p in st.x.items()}
    out.update({f"{k}.{n}": p for k, v in st.algo.items() for n, p in v.items()})
    out.update({f"clients.{k}.{n}": p for k, v in st.clients.items() for n, p in v.items()})
    return out


def run_rounds(sim, rounds, st=None):
    """``rounds`` rounds of ``sim`` from ``st`` (default: its initial state); returns (state, infos)."""
    st = sim.initial_state() if st is None else st
    infos = []
    for t in range(rounds):
        st, info = sim.round(st, t)
        infos.append(info)
    return st, infos


@pytest.fixture
def flower_task_identity():
    """Flower's message API outside its runtime needs a task identity (in-process strategy tests)."""
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id = TaskIdentity._node_id = TaskIdentity._task_id = None



# The Flower tests' run config: FSL on 4 clients of font-rendered '0123', fedsl's "mlp" in float64, replaying the
# simulator's run over the network (to compare with it); each test file states what it changes
FLOWER_RUN = {"rounds": 3, "seed": 1, "dtype": "float64", "eval_every": 100, "data.dataset": "synthetic_chars",
              "data.chars": "0123", "data.train_per_class": 30, "data.test_per_class": 10, "data.num_clients": 4,
              "data.classes_per_client": 2, "data.samples_per_client": 24, "data.server_size": 12, "model.name": "mlp",
              "algorithm.name": "fsl", "algorithm.clients_per_round": 2, "algorithm.local_lr": 0.05,
              "algorithm.batch_size": 10, "round-timeout": 5.0, "min-nodes": 0, "federation": "replay"}

def max_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over two models' parameters (in float64, on the CPU)."""
    return max((a[n].double().cpu() - b[n].double().cpu()).abs().max().item() for n in a)


# A run that finishes in seconds: 6 clients of font-rendered characters, a small CNN.
TINY = """
name = "tiny"
rounds = {rounds}
seed = 3
checkpoint_every = 3
dtype = "{dtype}"
executor = "{executor}"

[data]
dataset = "synthetic_chars"
chars = "0123"
train_per_class = 30
test_per_class = 15
num_clients = 6
classes_per_client = 2
server_size = 12

[model]
name = "small_cnn"

[algorithm]
name = "{alg}"
clients_per_round = 3
local_lr = 0.05
batch_size = 8
"""


def tiny_config(rounds=12, alg="fsl", dtype="float32", executor="auto", **top) -> dict:
    """``TINY`` as a config dict, with top-level keys (``seeds``, ``sweep``, ``device``, ...) set."""
    data = tomllib.loads(TINY.format(rounds=rounds, alg=alg, dtype=dtype, executor=executor))
    data.update(top)
    return data


# ----------------------------------------------------------------------------- idx fixtures

# dtype (kind, itemsize) -> idx type code: the inverse of fedsl.sources.idx.IDX_DTYPES
_IDX_CODES: dict[tuple[str, int], int] = {(dt.kind, dt.itemsize): code for code, dt in IDX_DTYPES.items()}


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an idx file (gzip-compressed when the name ends with .gz).

    Types: uint8, int8, int16, int32, float32, float64; at most 255 dimensions, each below 2**32.
    The gzip header carries no time stamp, so the same array always gives the same bytes.
    """
    path = Path(path)
    a = np.asarray(array)
    code = _IDX_CODES.get((a.dtype.kind, a.dtype.itemsize))
    if code is None:
        raise ValueError(f"write_idx: dtype {a.dtype} has no idx type code "
                         "(use uint8, int8, int16, int32, float32 or float64)")
    if a.ndim > 255 or any(d >= 2**32 for d in a.shape):
        raise ValueError(f"write_idx: shape {a.shape} does not fit the idx header")
    data = (bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
            + np.ascontiguousarray(a, dtype=IDX_DTYPES[code]).tobytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
            g.write(data)
    else:
        path.write_bytes(data)
    return path


# The README's test command runs the tests on 3 pytest-xdist workers, which take one test at a time
# (`--maxschedchunk 1`) in the order below, the longest first: a greedy schedule that keeps the 2 cores busy. A
# third worker because the longest tests (real SuperLinks and SuperNodes, Ray clusters, process pools, CLI runs
# killed and resumed) spend much of their time waiting for their processes; those waits overlap the other workers'
# work. These tests run side by side: each takes free ports, its own FLWR_HOME and its own folders, and sizes its
# timeouts for a busy machine.
SERVICE_MODULES = ["test_flower_deployment", "test_flower_secagg", "test_ray", "test_group_faults", "test_parallel"]


def _expected_length(item) -> int:
    """0 for the longest tests: those marked slow that start services, then the other slow ones, then the rest."""
    module = item.module.__name__.rsplit(".", 1)[-1]
    slow = item.get_closest_marker("slow") is not None
    service = module in SERVICE_MODULES
    return (0 if slow else 2) + (0 if service else 1)


def pytest_collection_modifyitems(config, items):
    # stable: within each length class the tests keep their files' order (every worker collects the same order)
    items.sort(key=_expected_length)


# ---- A real PostgreSQL server for the tune.storage tests (tests/test_tune_storage.py, fedsl tune on a URL) ----


def _postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl, postgres): initdb's on PATH, else Debian's
    /usr/lib/postgresql/VERSION/bin (the newest), which Debian leaves off PATH."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    folders = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                     if p.parent.name.isdigit() else 0)
    return next((f for f in reversed(folders) if (f / "initdb").is_file()), None)


@pytest.fixture(scope="session")
def _postgres_server():
    """A PostgreSQL server of this session (of this pytest-xdist worker), listening on a Unix socket only, in a
    temporary folder (no TCP port to collide over); its superuser ``postgres`` trusts every local connection.
    Yields (socket folder, port); stopped (immediate shutdown, then SIGKILL) and removed at the session's end.
    Skips when the server programs or the psycopg2 driver are absent. PostgreSQL refuses to run as root: as root the
    server runs as the ``postgres`` user (Debian's package makes it), else as ``nobody``."""
    pytest.importorskip("psycopg2", reason="PostgreSQL's driver psycopg2 is absent (pip install psycopg2-binary)")
    import psycopg2

    bin_dir = _postgres_bin()
    if bin_dir is None or not all((bin_dir / p).is_file() for p in ("initdb", "pg_ctl", "postgres")):
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl, postgres) are not installed")
    as_user: dict = {}
    if os.geteuid() == 0:
        import pwd

        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
                break
        else:
            pytest.skip("PostgreSQL refuses to run as root and there is no 'postgres' or 'nobody' user to run it as")
    # in /tmp, not pytest's folder (private to root): the server's user must reach it; short for the socket's path
    base = Path(tempfile.mkdtemp(prefix="fedsl-pg-"))
    if as_user:
        os.chown(base, as_user["user"], as_user["group"])
    data, log = base / "data", base / "server.log"
    env = {**os.environ, "LC_ALL": "C", "HOME": str(base)}
    run = dict(cwd=base, env=env, **as_user)
    proc = None
    try:
        init = subprocess.run([bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                               "--no-sync"], capture_output=True, text=True, timeout=180, **run)
        if init.returncode:
            pytest.fail(f"initdb failed: {init.stderr.strip()[-2000:]}")
        with socket.socket() as s:  # a port number names the socket file; a free TCP one is as good as any
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # fsync off: the tests kill clients, never the server; small shared memory: one per xdist worker
        with open(log, "wb") as out:
            proc = subprocess.Popen([bin_dir / "postgres", "-D", data, "-k", base, "-p", str(port),
                                     "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
                                     "-c", "full_page_writes=off", "-c", "shared_buffers=16MB"],
                                    stdout=out, stderr=subprocess.STDOUT, **run)
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg2.connect(host=str(base), port=port, user="postgres", dbname="postgres",
                                 connect_timeout=5).close()
                break
            except psycopg2.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the PostgreSQL server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        yield base, port
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([bin_dir / "pg_ctl", "stop", "-D", data, "-m", "immediate", "-w", "-t", "20"],
                               capture_output=True, timeout=30, **run)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


_DATABASES = itertools.count()  # the databases of this process's server, one per test


@pytest.fixture
def postgres_url(_postgres_server) -> str:
    """A SQLAlchemy URL of a new, empty database of the session's PostgreSQL server (``_postgres_server``), one per
    test: ``postgresql+psycopg2://postgres@/DB?host=SOCKET_FOLDER&port=PORT``."""
    import psycopg2

    base, port = _postgres_server
    name = f"fedsl_{next(_DATABASES)}"
    conn = psycopg2.connect(host=str(base), port=port, user="postgres", dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    return f"postgresql+psycopg2://postgres@/{name}?host={base}&port={port}"


def flower_rc(*parts: dict) -> dict:
    """Flower run configs merged left to right, switching the algorithm as `--set` does: server learning's keys
    (``server.gamma``, ``server.batch_size``, ...) are dropped where the result learns nothing on the server, since a
    run config refuses a key its run does not read."""
    from fedsl.algorithms import SPECS
    rc = {k: v for p in parts for k, v in p.items()}
    name, learning = rc.get("algorithm.name"), rc.get("server.learning", "auto")
    if name in SPECS and SPECS[name].server_mode(learning) == "off":
        kept = ("server.learning", "server.pretrain", "server.finetune", "server.log_angle")
        rc = {k: v for k, v in rc.items() if not k.startswith("server.") or k.startswith(kept)}
    return rc
