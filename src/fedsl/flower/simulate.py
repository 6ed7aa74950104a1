"""A Flower App's simulation that says how it ended: ``python -m fedsl.flower.simulate APP_DIR``.

``flwr run APP local --stream`` (Flower 1.42) starts a local SuperLink on first use, streams the
ServerApp's log and exits 0 whether the run completed or failed (the status is only in
``flwr ls``), and leaves that SuperLink, and its SuperExec, running. This wraps it:

- the run's final status is read back (``flwr ls local --run-id ID --format json``); anything but
  ``finished:completed`` ends in one line naming the status, its details and ``flwr log ID``,
  exit code 1;
- a local SuperLink this command started is stopped at the end (its process group: the
  SuperExec and any simulation process with it), so nothing outlives the command; one that was
  already running is left as it was;
- Ctrl-C or SIGTERM stops the run (``flwr stop``) before stopping the SuperLink; exit code 130.

The ports are Flower's (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, ``FLWR_LOCAL_CONTROL_API_PORT``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional, Sequence


def local_port() -> str:
    """The HTTP port of Flower's managed local SuperLink (its env override, else its default)."""
    from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT
    return str(LOCAL_SUPERLINK_HTTP_API_PORT)


def superlink_up(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
            return 200 <= r.status < 300
    except OSError:
        return False


def _flwr() -> str:
    """The ``flwr`` beside this Python (a venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("flwr")
    found = str(here) if here.exists() else shutil.which("flwr")
    if found is None:
        raise SystemExit("fedsl.flower.simulate: no `flwr` command found; expected Flower installed "
                         "(pip install -e '.[flower]')")
    return found


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process (``ps``, full width)."""
    try:
        out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    rows = []
    for line in out.splitlines():
        pid, ppid, args = (line.strip().split(None, 2) + [""])[:3]
        rows.append((int(pid), int(ppid), args))
    return rows


def superlink_tree(port: str) -> list[int]:
    """The local SuperLink serving ``port`` and every process under it (its SuperExec, a simulation)."""
    rows = _processes()
    tree = [pid for pid, _, args in rows
            if "flower-superlink" in args and re.search(rf"--port[ =]{re.escape(port)}(\s|$)", args)]
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in rows:
        children.setdefault(ppid, []).append(pid)
    for pid in tree:  # grows while it is walked: breadth-first
        tree.extend(c for c in children.get(pid, []) if c not in tree)
    return tree


def stop_superlink(port: str, grace: float = 10.0) -> None:
    """Stop the local SuperLink on ``port`` and every process under it: SIGTERM, then SIGKILL after ``grace`` s.

    The tree is taken before the first signal: a simulation process started by the SuperExec sits in a
    session of its own, and once its parents are gone nothing would lead to it."""
    tree = superlink_tree(port)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(tree):
            time.sleep(0.2)
        if not _alive(tree):
            return


def _alive(pids: list[int]) -> bool:
    """Whether any of ``pids`` still runs (a zombie, dead but not yet reaped, does not count)."""
    running = {pid for pid, _, args in _processes() if args != "<defunct>" and not args.endswith("<defunct>")}
    return any(p in running for p in pids)


def run_status(flwr: str, run_id: str) -> tuple[str, str]:
    """(status, details) of run ``run_id`` on the local SuperLink, e.g. ("finished:completed", "N/A")."""
    res = subprocess.run([flwr, "ls", "local", "--run-id", run_id, "--format", "json"],
                         capture_output=True, text=True)
    try:
        (run,) = [r for r in json.loads(res.stdout)["runs"] if str(r["run-id"]) == run_id]
    except (ValueError, KeyError, TypeError):
        return "unknown", (res.stdout + res.stderr).strip()[-300:]
    return run["status"], run.get("status-details", "")


def simulate(app: Path, num_supernodes: int, extra: Sequence[str] = (), out=sys.stdout) -> int:
    """Run ``app`` in Flower's simulation on ``num_supernodes`` virtual SuperNodes; 0 when it completed."""
    flwr, port = _flwr(), local_port()
    started_here = not superlink_up(port)
    cmd = [flwr, "run", str(app), "local", "--federation-config", f"num-supernodes={num_supernodes}",
           "--stream", *extra]
    run_id: Optional[str] = None
    try:
        # flwr starts `flower-superlink` from PATH: this Python's scripts first, as an activated venv would
        env = {**os.environ, "PATH": os.pathsep.join([str(Path(flwr).parent), os.environ.get("PATH", "")])}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env)
        try:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                m = run_id is None and re.search(r"started run (\d+)", line)
                if m:
                    run_id = m.group(1)
            proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            if run_id is not None:
                subprocess.run([flwr, "stop", run_id, "local"], capture_output=True)
            print(f"fedsl.flower.simulate: interrupted; run {run_id or '(not started)'} stopped", file=out)
            return 130
        if run_id is None:
            print(f"fedsl.flower.simulate: `flwr run` exited with code {proc.returncode} before starting a "
                  f"run; see its output above", file=out)
            return proc.returncode or 1
        status, details = run_status(flwr, run_id)
        if status != "finished:completed":
            print(f"fedsl.flower.simulate: run {run_id} ended {status}: {details or 'no details'} "
                  f"(its log: flwr log {run_id} local --show)", file=out)
            return 1
        return 0
    finally:
        if started_here:
            stop_superlink(port)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedsl.flower.simulate",
        description="Run a Flower App in Flower's simulation (flwr run APP local --stream), exit 1 when the "
                    "run did not complete, and stop the local SuperLink if this command started it.")
    p.add_argument("app", type=Path, help="the Flower App's folder (its pyproject.toml)")
    p.add_argument("--num-supernodes", type=int, default=3, help="virtual SuperNodes (default 3)")
    p.epilog = "More `flwr run` options go after --, e.g. -- --run-config 'rounds=20'."
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if not (a.app / "pyproject.toml").is_file():
        p.exit(2, f"fedsl.flower.simulate: {str(a.app)!r} has no pyproject.toml; expected a Flower App's folder\n")
    if a.num_supernodes < 1:
        p.exit(2, f"fedsl.flower.simulate: --num-supernodes {a.num_supernodes}: expected at least 1\n")
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM as Ctrl-C: the run is stopped and the SuperLink too
    return simulate(a.app, a.num_supernodes, extra)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
