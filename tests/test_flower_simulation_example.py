"""The example Flower App in Flower's simulation, run as a first-time user runs it: HOME an empty folder (a new
``~/.flwr``, Flower's isolated runtime environment, an empty fedsl data cache), through the documented command
``python -m fedsl.flower.simulate examples/flower-app``. A completed run exits 0; a run whose ServerApp fails exits
1 with one line naming its status; one stopped by SIGTERM exits 130; each way the local SuperLink the command
started is stopped with everything under it (free ports here, through Flower's own port variables)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="needs fedsl[flower]")
pytest.importorskip("ray", reason="Flower's simulation runtime needs flwr[simulation] (Ray)")

from fedsl.flower.simulate import _processes, superlink_up  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def new_user(tmp_path):
    """The environment of a user with a fresh HOME, and Flower's local ports moved to free ones."""
    home = tmp_path / "home"
    home.mkdir()
    port, control = str(_free_port()), str(_free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "FEDSL_"))}
    env.update(HOME=str(home), FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=port, FLWR_LOCAL_CONTROL_API_PORT=control,
               OMP_NUM_THREADS="1")
    yield env, port
    from fedsl.flower.simulate import stop_superlink
    stop_superlink(port)  # only if a failed assertion left it up


def _left_on(port: str) -> list[str]:
    """Live processes that serve or talk to the SuperLink on ``port`` (the SuperLink, its SuperExec, a
    simulation process: each names the port in its command line)."""
    return [args for _, _, args in _processes() if not args.endswith("<defunct>")
            and (f"--port {port}" in args or f"127.0.0.1:{port}" in args)]


def _simulate(env, *extra, timeout=400):
    return subprocess.run([sys.executable, "-m", "fedsl.flower.simulate", str(APP), *extra], cwd=APP, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_example_completes_for_a_new_user_and_a_failed_run_exits_1_and_nothing_outlives_either(new_user):
    env, port = new_user
    res = _simulate(env, "--", "--run-config", "rounds=3")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "fedsl: final test accuracy" in res.stdout and "after 3 rounds" in res.stdout, res.stdout[-3000:]
    assert not superlink_up(port) and not _left_on(port)

    res = _simulate(env, "--", "--run-config", "rounds=-1")
    last = res.stdout.strip().splitlines()[-1]
    assert res.returncode == 1, res.stdout[-3000:]
    assert last.startswith("fedsl.flower.simulate: run ") and "ended finished:failed" in last, last
    assert "rounds = -1" in last and "flwr log" in last, last
    assert not superlink_up(port) and not _left_on(port)

    # stopped in its run (SIGTERM, as a scheduler's kill): exit 130, the run stopped, nothing left
    proc = subprocess.Popen([sys.executable, "-m", "fedsl.flower.simulate", str(APP), "--", "--run-config",
                             "rounds=1000"], cwd=APP, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Starting Flower Simulation" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + out
    assert "fedsl.flower.simulate: interrupted; run " in out and " stopped" in out, out
    assert not superlink_up(port) and not _left_on(port)


def test_bad_arguments_stop_in_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fedsl.flower.simulate", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
    assert "has no pyproject.toml; expected a Flower App's folder" in res.stderr
    res = subprocess.run([sys.executable, "-m", "fedsl.flower.simulate", str(APP), "--num-supernodes", "0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--num-supernodes 0: expected at least 1" in res.stderr, res.stderr
