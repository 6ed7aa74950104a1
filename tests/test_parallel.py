"""A sweep's runs side by side on one machine (`fedsl run --parallel N`) and the automatic thread count."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY
from test_group_faults import assert_same_group

from fedsl.config import loading
from fedsl.core import threads
from fedsl.sweeps.compare import run_group

SWEEP = '\n[sweep]\n"server.gamma" = [0.5, 1.0, 1.5]\n'
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def sweep_config(tmp_path: Path, rounds: int) -> Path:
    p = tmp_path / "sweep.toml"
    p.write_text("threads = 1\n" + TINY.format(rounds=rounds, alg="fsl", dtype="float32", executor="sequential")
                 + SWEEP)
    return p


def fedsl(*args):
    return subprocess.run([sys.executable, "-m", "fedsl.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


@pytest.mark.slow
def test_parallel_sweep_interrupted_and_resumed_equals_serial_and_never_imports_ray(tmp_path, capfd,
                                                                                   monkeypatch):
    """A real `fedsl run --parallel 2` process, SIGTERMed with two runs in progress; `fedsl resume --parallel 2`
    then runs in this process (its workers are processes of their own), with Ray made unimportable."""
    from fedsl.cli import main
    cfg_file = sweep_config(tmp_path, rounds=20)
    out = tmp_path / "par"
    # the driver is SIGTERMed mid-sweep: its workers checkpoint their runs, `fedsl resume --parallel` finishes them
    code = ("import sys; from fedsl.cli import main; rc = main(sys.argv[1:]); "
            "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(rc)")
    proc = subprocess.Popen([sys.executable, "-c", code, "run", str(cfg_file), "--out", str(out), "--parallel", "2"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        busy = [m.parent for m in out.glob("*/metrics.csv") if len(m.read_text().splitlines()) >= 6
                and not (m.parent / "summary.json").exists()]
        if len(busy) == 2:  # two runs side by side, in the middle
            break
        time.sleep(0.02)
    assert len(busy) == 2, "two runs should be in progress side by side"
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, stdout[-3000:]
    assert all('"status": "interrupted"' in (d / "summary.json").read_text() for d in busy), stdout[-3000:]
    # and nothing else started after the SIGTERM (a unit queued in a worker used to run to its end)
    assert sorted(m.parent for m in out.glob("*/metrics.csv")) == sorted(busy), stdout[-3000:]
    done = 0

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises: the resume must not import it
    capfd.readouterr()
    rc = main(["resume", str(out), "--parallel", "2"])
    r = capfd.readouterr()
    assert rc == 0, r.out[-3000:] + r.err[-3000:]
    assert sys.modules["ray"] is None
    assert f"running {3 - done} runs in 2 worker processes (1 torch thread each)" in r.out
    serial = tmp_path / "serial"
    run_group(loading.load(cfg_file), serial, log=lambda s: None, progress=False)
    assert_same_group(out, serial)
    assert main(["sweep", "status", str(out)]) == 0
    status = capfd.readouterr().out
    assert "3 completed" in status, status


@pytest.mark.slow
def test_a_sweep_whose_last_run_is_alone_exits_on_sigterm(tmp_path):
    """SIGTERM once two runs have finished and the third runs alone, its worker's partner idle: the
    running run checkpoints and the driver exits 143 (it used to wait forever: the idle worker, killed
    while it waited for work, took the pool's queue lock with it)."""
    cfg_file = tmp_path / "sweep.toml"
    cfg_file.write_text("threads = 1\n" + TINY.format(rounds=1, alg="fsl", dtype="float32", executor="sequential")
                        + '\n[sweep]\n"rounds" = [1, 2, 5000]\n')
    out = tmp_path / "par"
    proc = subprocess.Popen([sys.executable, "-m", "fedsl.cli", "run", str(cfg_file), "--out", str(out), "--parallel",
                             "2"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        last = out / "tiny-rounds=5000"
        deadline = time.time() + 180
        while time.time() < deadline and not (len(list(out.glob("*/summary.json"))) == 2 and (
                last / "metrics.csv").is_file() and len((last / "metrics.csv").read_text().splitlines()) >= 3):
            time.sleep(0.05)
        assert len(list(out.glob("*/summary.json"))) == 2, "two runs should have finished"
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, stdout[-3000:]
    assert '"status": "interrupted"' in (last / "summary.json").read_text(), stdout[-3000:]


def test_bad_parallel_options_are_one_line(tmp_path, capsys):
    """The first case through a real `fedsl` process, the others (the same error path) in this one."""
    from fedsl.cli import main
    cfg_file = sweep_config(tmp_path, rounds=1)
    for i, (args, expected) in enumerate(((["--parallel", "-1"], "--parallel -1: expected a number of processes"),
                                          (["--parallel", "2", "--ray", "auto"], "expected one of them"),
                                          (["--ray-resources", "cpus=1"], "expected together with --ray"))):
        argv = ["run", str(cfg_file), "--out", str(tmp_path / "x"), *args]
        if i == 0:
            r = fedsl(*argv)
            rc, err = r.returncode, r.stderr
        else:
            rc, err = main(argv), capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and expected in err, (args, err)


def test_automatic_threads_rule():
    rule = threads.choose_threads
    assert rule(current=2, cores=2) == 2  # an idle 2-core machine: torch's default
    assert rule(current=8, cores=2) == 2  # never more than the cores this process may use (affinity)
    assert rule(current=2, cores=2, omp=1) == 1  # OMP_NUM_THREADS (a scheduler, Ray) is obeyed
    assert rule(current=2, cores=2, concurrent=2) == 1  # two runs side by side: one core each
    assert rule(current=16, cores=16, concurrent=3) == 5
    assert rule(current=2, cores=2, concurrent=8) == 1  # at least one
    assert rule(current=2, cores=2, load=1.2) == 1  # another process keeps a core busy
    assert rule(current=4, cores=4, load=16.0) == 1  # a crowded machine: one thread, no spinning
    assert rule(current=2, cores=2, load=0.3) == 2
    assert rule(current=1, cores=8) == 1  # a caller's torch.set_num_threads(1) is never raised


def test_automatic_threads_never_raise_the_callers_setting(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setattr(threads, "_chosen", None)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert threads.apply(0) == 1 and torch.get_num_threads() == 1
        assert threads.apply(2) == 2 and torch.get_num_threads() == 2  # threads = N is N
        assert threads.apply(0) == 1  # chosen once per process (here: 1, the setting at the first call)
    finally:
        torch.set_num_threads(before)
