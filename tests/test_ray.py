"""Sweeps on a real two-node Ray cluster on loopback (`fedsl run ... --ray HOST:PORT`).

One cluster for the module: a head node and a second node joined to it, 1 CPU each, started
with `ray start` in a short temporary folder; every process they started is killed at the end
(found by that folder in their command lines, and their children), and the test checks that
none is left. The runs write into the group folder (the loopback nodes share the filesystem).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import TINY
from test_group_faults import assert_same_group

from fedsl.config import loading
from fedsl.sweeps.compare import run_group

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
SWEEP = '\n[sweep]\n"server.gamma" = [0.5, 1.0, 1.5, 2.0]\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (from /proc)."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out[int(p)] = (ppid, cmd)
    return out


def _tree(match) -> set[int]:
    """Processes whose command line satisfies ``match``, and all their descendants (never this one)."""
    ps = _processes()
    found = {p for p, (_, cmd) in ps.items() if match(cmd)} - {os.getpid()}
    grew = True
    while grew:
        grew = False
        for p, (pp, _) in ps.items():
            if pp in found and p not in found and p != os.getpid():
                found.add(p)
                grew = True
    return found


def _kill(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Cluster:
    def __init__(self) -> None:
        # short: Ray's unix sockets live under it (~107 characters at most)
        self.tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.worker_port = free_port()  # the second node's node manager: names its raylet
        self.env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1", "OMP_NUM_THREADS": "1",
                    # a lost node is noticed within ~2 s instead of ~30 s
                    "RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "500",
                    "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "3"}

    def ours(self, cmd: str) -> bool:
        return self.tmp in cmd or f":{self.port} " in cmd + " " and "ray" in cmd

    def start(self) -> None:
        def common():  # each node its own ports: nothing shared with another Ray on this machine
            return ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                    f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
                    f"--runtime-env-agent-port={free_port()}"]
        head = [RAY, "start", "--head", f"--port={self.port}", f"--temp-dir={self.tmp}", "--include-dashboard=false",
                f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}", *common()]
        node = [RAY, "start", f"--address={self.address}", f"--node-manager-port={self.worker_port}", *common()]
        for cmd in (head, node):
            r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    def kill_second_node(self) -> None:
        """kill -9 the second node's raylet and its children (its workers): the node is lost."""
        raylet = _tree(lambda cmd: "raylet" in cmd and f"--node_manager_port={self.worker_port}" in cmd)
        assert raylet, "the second node's raylet was not found"
        _kill(raylet)

    def stop(self) -> None:
        for _ in range(3):
            _kill(_tree(self.ours))
            time.sleep(0.5)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()
    left = [cmd[:120] for p, (_, cmd) in _processes().items() if p in _tree(c.ours)]
    assert not left, f"Ray processes left behind: {left}"


def sweep_config(tmp_path: Path, rounds: int) -> Path:
    p = tmp_path / "sweep.toml"
    # threads = 1: the serial reference uses the one thread each task gets
    p.write_text("threads = 1\n" + TINY.format(rounds=rounds, alg="fsl", dtype="float32", executor="sequential")
                 + SWEEP)
    return p


def serial(cfg_file: Path, out: Path) -> Path:
    run_group(loading.load(cfg_file), out, log=lambda s: None, progress=False)
    return out


def fedsl(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "fedsl.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env or {**os.environ, "OMP_NUM_THREADS": "1"}, **kw)


def test_one_cluster_sweep_spreads_over_both_nodes_and_a_lost_node_loses_nothing(cluster, tmp_path, capsys):
    """Both checks on one cluster, one after the other (a test per check would start a cluster per
    pytest-xdist worker that runs one)."""
    sweep_spreads_over_both_nodes_into_the_serial_runs_files(cluster, tmp_path / "spread", capsys)
    a_lost_node_loses_nothing(cluster, tmp_path / "lost")
    a_study_runs_as_tasks_and_keeps_its_budget(cluster, tmp_path / "tune")


def a_study_runs_as_tasks_and_keeps_its_budget(cluster, tmp_path):
    """`fedsl tune --ray --parallel 2`: the study's two workers as tasks, asking for trials under the folder's lock:
    the variant ends with exactly its budget of finished trials, none left running, in Optuna's journal file (the
    storage a cluster's shared folder takes by default), not in SQLite."""
    pytest.importorskip("optuna")
    import optuna
    tmp_path.mkdir()
    cfg_file = tmp_path / "tune.toml"
    cfg_file.write_text("threads = 1\n" + TINY.format(rounds=4, alg="fsl", dtype="float32", executor="sequential")
                        + "\n[tune]\ntrials = 3\nstartup_trials = 1\nvalidation = 0.2\nedge_widenings = 0\n")
    out = tmp_path / "study"
    r = fedsl("tune", str(cfg_file), "--out", str(out), "--ray", cluster.address, "--parallel", "2", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    name = loading.load(cfg_file).name
    from fedsl.config.tune_storage import open_storage
    assert (out / "study.journal").is_file() and not (out / "study.db").exists()
    study = optuna.load_study(study_name=name, storage=open_storage("journal", out))
    assert sorted(t.state.name for t in study.trials) in (["COMPLETE"] * 3, ["COMPLETE", "COMPLETE", "PRUNED"],
                                                         ["COMPLETE", "PRUNED", "PRUNED"])
    assert not list(out.glob(".fedsl-ray-*"))  # the driver's visibility token is removed


def sweep_spreads_over_both_nodes_into_the_serial_runs_files(cluster, tmp_path, capsys):
    tmp_path.mkdir()
    cfg_file = sweep_config(tmp_path, rounds=6)
    out = tmp_path / "ray"
    r = fedsl("run", str(cfg_file), "--out", str(out), "--ray", cluster.address)
    assert r.returncode == 0, r.stderr[-3000:]
    nodes = {line.rsplit("(node ", 1)[1].rstrip(")") for line in r.stdout.splitlines() if "runs, " in line
             and "(node " in line}
    assert len(nodes) == 2, r.stdout  # 4 runs of 1 CPU on two 1-CPU nodes
    assert_same_group(out, serial(cfg_file, tmp_path / "serial"))
    assert not list(out.glob(".fedsl-ray-*"))  # the driver's visibility token is removed
    from fedsl.cli import main
    capsys.readouterr()
    assert main(["sweep", "status", str(out)]) == 0
    status = capsys.readouterr().out
    assert "4 completed" in status, status


def a_lost_node_loses_nothing(cluster, tmp_path):
    """The second node killed while two runs are 5 rounds in (of 20): its run resumes on the head from a checkpoint."""
    tmp_path.mkdir()
    cfg_file = sweep_config(tmp_path, rounds=20)
    out = tmp_path / "ray"
    proc = subprocess.Popen([sys.executable, "-m", "fedsl.cli", "run", str(cfg_file), "--out", str(out), "--ray",
                             cluster.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # two runs in progress: one on each node
            busy = [m for m in out.glob("*/metrics.csv") if len(m.read_text().splitlines()) >= 6
                    and not (m.parent / "summary.json").exists()]
            if len(busy) == 2:
                break
            time.sleep(0.05)
        assert len(busy) == 2, "two runs should be in progress side by side"
        cluster.kill_second_node()
        stdout, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout[-3000:]
    assert "resuming at round" in stdout, stdout[-3000:]  # Ray retried the lost task; it went on from a checkpoint
    assert_same_group(out, serial(cfg_file, tmp_path / "serial"))  # and nothing was lost: identical files


def test_a_bad_address_is_one_line(tmp_path, capsys):
    """The first case through a real `fedsl` process, the others (the same error path) in this one."""
    from fedsl.cli import main
    cfg_file = sweep_config(tmp_path, rounds=2)
    port = free_port()  # nothing listens there
    for address, expected in ((f"127.0.0.1:{port}", "no Ray head answers there"), ("nohost", "expected HOST:PORT")):
        argv = ["run", str(cfg_file), "--out", str(tmp_path / "x"), "--ray", address]
        if address == "nohost":
            rc, err = main(argv), capsys.readouterr().err
        else:
            r = fedsl(*argv)
            rc, err = r.returncode, r.stderr
        assert rc == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --ray {address!r}: ") and expected in lines[0], lines
        assert not (tmp_path / "x").exists()  # refused before any work
    rc = main(["tune", str(cfg_file), "--out", str(tmp_path / "t"), "--ray", f"127.0.0.1:{port}"])  # fedsl tune too
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no Ray head answers there" in err, err
    assert not (tmp_path / "t").exists()
    rc = main(["run", str(cfg_file), "--out", str(tmp_path / "x"), "--ray", "127.0.0.1:1", "--ray-resources", "cpus=0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cpus=0" in err, err
