"""Seconds per round and peak resident memory as N grows: FedAvg, FSL and SCAFFOLD (sparse client store) on the
cross-device benchmark (LEAF's synthetic data, ``data.dataset = 'synthetic_leaf'``, logistic regression, the
``cross-device`` preset's settings), N ∈ {10^3, 10^4, 10^5, 10^6}, S ∈ {10, 100}.

    python benchmarks/scale.py                      # the table, markdown, on stdout
    python benchmarks/scale.py --rounds 3 --n 1000 10000 --methods fedavg --s 10   # a smaller one

Each point runs in a fresh subprocess (``--child``), so that its peak resident memory is its own: the parent reads
it from the child's rusage (``os.wait4``, ru_maxrss), which counts everything the process touched (Python, torch,
the federation, the client store). The child builds the run (``fedsl.runs.build.prepare``: the federation,
its test set and D0, the simulator), runs one untimed round, then ``--rounds`` timed rounds
(``Simulator.round``: sampling S of N, the sampled clients' samples made on demand, their training, the server's
update and server learning; no evaluation). It reports the wall-clock and CPU seconds per round (means over the
timed rounds) and the samples the sampled clients trained on: clients' sizes follow LEAF's power law (5 to 1,000
samples), so a round's work depends on which clients it drew, and the cost per sample trained is the figure that
only N could move. The points are interleaved (each pass over N goes up, the next down) so that a change of the
machine's load falls on every N alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NS = (1_000, 10_000, 100_000, 1_000_000)
SS = (10, 100)
METHODS = ("fedavg", "fsl", "scaffold")
NAMES = {"fedavg": "FedAvg", "fsl": "FSL", "scaffold": "SCAFFOLD"}


def config(method: str, n: int, s: int, rounds: int) -> dict:
    """The cross-device preset's run (its data, model and algorithm settings) at N = n, S = s."""
    return {"rounds": rounds, "seed": 0, "threads": 1,
            "data": {"dataset": "synthetic_leaf", "num_clients": n, "server_size": 500},
            "model": {"name": "logreg"},
            "algorithm": {"name": method, "clients_per_round": s, "local_lr": 0.01, "batch_size": 4,
                          "local_epochs": 1, "global_lr": 1.0},
            "server": {"gamma": 1.0}, "client_state": {"store": "sparse"}}


def child(method: str, n: int, s: int, rounds: int) -> dict:
    """One point, in this process: build, one untimed round, ``rounds`` timed ones."""
    import torch
    torch.set_num_threads(1)
    from fedsl.config.schema import validate
    from fedsl.runs.build import prepare

    start = time.perf_counter()
    sim = prepare(validate(config(method, n, s, rounds + 1))).sim
    built = time.perf_counter() - start
    state = sim.initial_state()
    state, _ = sim.round(state, 0)
    wall = cpu = 0.0
    trained = 0
    for t in range(1, rounds + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        state, info = sim.round(state, t)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        trained += int(sim.fed.clients.sizes_of(info.clients.tolist()).sum())
    return {"build_s": built, "wall_s": wall / rounds, "cpu_s": cpu / rounds, "samples": trained / rounds}


def point(method: str, n: int, s: int, rounds: int) -> dict:
    """One point in a fresh subprocess; its result and its peak RSS (MB) from the child's own rusage (``os.wait4``
    reaps it, so Popen must not: its output is read by hand, its stderr goes to a file)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, str(n), str(s), "--rounds", str(rounds)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{method} N={n} S={s} failed:\n{err.read().decode()[-2000:]}")
    res = json.loads(out.decode().strip().splitlines()[-1])
    res["peak_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    return res


def machine() -> list[str]:
    model = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 2**20
    import torch
    return [f"- cpu: {model}, {os.cpu_count()} logical CPUs, {mem:.0f} GiB RAM",
            f"- python {platform.python_version()}, torch {torch.__version__}, one torch thread per point"]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return ", ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=3, metavar=("METHOD", "N", "S"), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per point (after one untimed)")
    p.add_argument("--passes", type=int, default=1, help="passes over every point (medians over passes)")
    p.add_argument("--n", type=int, nargs="+", default=list(NS))
    p.add_argument("--s", type=int, nargs="+", default=list(SS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    a = p.parse_args(argv)
    if a.child:
        method, n, s = a.child[0], int(a.child[1]), int(a.child[2])
        print(json.dumps(child(method, n, s, a.rounds)))
        return 0
    began, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), loadavg()
    t0 = time.perf_counter()
    results: dict[tuple, list[dict]] = {}
    for k in range(a.passes):
        for s in a.s:
            for method in a.methods:
                for n in (a.n if k % 2 == 0 else a.n[::-1]):
                    r = point(method, n, s, a.rounds)
                    results.setdefault((s, method, n), []).append(r)
                    print(f"  {NAMES[method]} S={s} N={n:,}: {r['wall_s']:.3f} s/round, {r['peak_mb']:.0f} MB",
                          file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    load1 = loadavg()
    lines = [f"Measured {began} in {elapsed / 60:.1f} min with `python benchmarks/scale.py "
             f"--rounds {a.rounds} --passes {a.passes}`.", "", *machine(),
             f"- load average (1, 5, 15 min): {load0} at the start, {load1} at the end", "",
             "| S | method | N | build s | s/round (wall) | s/round (CPU) | samples/round | µs/sample (CPU) | "
             "peak RSS MB |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]

    def med(rs, key):
        v = sorted(r[key] for r in rs)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    for s in a.s:
        for method in a.methods:
            for n in a.n:
                rs = results[(s, method, n)]
                cpu, samples = med(rs, "cpu_s"), med(rs, "samples")
                lines.append(f"| {s} | {NAMES[method]} | {n:,} | {med(rs, 'build_s'):.2f} | {med(rs, 'wall_s'):.3f} | "
                             f"{cpu:.3f} | {samples:,.0f} | {1e6 * cpu / max(samples, 1):.1f} | "
                             f"{max(r['peak_mb'] for r in rs):,.0f} |")
    lines += ["", "Ratio N = max / N = min (flat is 1):", ""]
    lo, hi = min(a.n), max(a.n)
    for s in a.s:
        for method in a.methods:
            r_lo, r_hi = results[(s, method, lo)], results[(s, method, hi)]
            per = [1e6 * med(rs, "cpu_s") / max(med(rs, "samples"), 1) for rs in (r_lo, r_hi)]
            lines.append(f"- S = {s}, {NAMES[method]}: s/round (wall) {med(r_hi, 'wall_s') / med(r_lo, 'wall_s'):.2f}x,"
                         f" CPU µs per sample {per[1] / per[0]:.2f}x, peak RSS "
                         f"{max(r['peak_mb'] for r in r_hi) / max(r['peak_mb'] for r in r_lo):.2f}x")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    sys.exit(main())
