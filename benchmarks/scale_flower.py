"""Flower's simulation on the scale table's work: FedAvg at S = 10 on LEAF's synthetic clients (logistic
regression, η_l = 0.01, B = 4, one epoch), N ∈ {10^3, 10^4, 10^5, 10^6}, up to the largest N it completes.

    python benchmarks/scale_flower.py                    # the rows, markdown, on stdout
    python benchmarks/scale_flower.py --n 1000 --rounds 2

Flower 1.x's ``run_simulation`` (Ray backend, 2 actors × 1 CPU, one torch thread each, as
``benchmarks/bench.py``'s Flower peer) with ``num_supernodes = N``; the ServerApp runs
``flwr.serverapp.strategy.FedAvg`` (S of the N nodes train each round, no federated evaluation); the ClientApp
makes client k's training samples from (seed, k) as fedsl does (``fedsl.data.generated.samples``, so every client
holds what it holds in fedsl's run) and trains them with the plain PyTorch loop (``torch.optim.SGD`` over a
shuffling DataLoader). The rounds are timed between the strategy's calls of ``evaluate_fn`` (after one untimed
round; start-up, the nodes' registration included, is reported apart). Each N runs in a fresh subprocess with a
time limit; memory is the peak, over samples every half second, of the summed resident memory of that
subprocess and all its descendants (Ray's GCS, raylet and workers; shared pages count once per process, as RSS
does).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NS = (1_000, 10_000, 100_000, 1_000_000)


def tree(root: int) -> tuple[list[int], float]:
    """Process ``root`` and its descendants, and their summed VmRSS in MB, read from /proc."""
    procs: dict[int, tuple[int, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/status") as f:
                rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except (OSError, ValueError, IndexError):
            continue
        procs[int(d)] = (ppid, rss)
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    total, stack, pids = 0, [root], []
    while stack:
        p = stack.pop()
        pids.append(p)
        total += procs.get(p, (0, 0))[1]
        stack += kids.get(p, [])
    return pids, total / 1024


def kill_tree(root: int) -> None:
    """SIGKILL process ``root``'s descendants and then it (the processes this script started)."""
    pids, _ = tree(root)
    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@functools.lru_cache(maxsize=2)
def _train_sizes(n: int):
    from fedsl.data import generated, synthetic_leaf
    return generated.train_sizes(synthetic_leaf.client_sizes(0, n, 1000))


@functools.lru_cache(maxsize=1)
def _devices():
    from fedsl.data import synthetic_leaf
    return synthetic_leaf.devices(0)


def make_client_app():
    """The ClientApp: client k's samples made from (seed 0, k), one epoch of plain SGD, the arrays back."""
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        from fedsl.data import generated
        from fedsl.models import build_model
        torch.set_num_threads(1)
        cfg = msg.content["config"]
        k = int(context.node_config["partition-id"])
        n = int(_train_sizes(int(cfg["num_clients"]))[k])
        x, y = generated.samples(_devices(), 0, k, n)
        model = build_model("logreg", 5, (60,), seed=0)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
        loader = DataLoader(TensorDataset(torch.from_numpy(x).float(), torch.from_numpy(y)), batch_size=4,
                            shuffle=True, drop_last=True)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                           "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)

    return app


def child(n: int, s: int, rounds: int, max_mb: float) -> dict:
    """One N in this process: the simulation, its rounds' times and start-up; the tree's peak RSS sampled."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from fedsl.models import build_model
    torch.set_num_threads(1)
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:  # a shared machine: past max_mb the simulation is stopped, not left to swap or be killed
        while not done.is_set():
            peak[0] = max(peak[0], tree(os.getpid())[1])
            if peak[0] > max_mb:
                print(f"stopped: the process tree's memory passed {max_mb:,.0f} MB", file=sys.stderr, flush=True)
                pids, _ = tree(os.getpid())
                for pid in reversed(pids[1:]):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                os._exit(3)
            done.wait(0.5)

    threading.Thread(target=watch, daemon=True).start()
    stamps: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        model = build_model("logreg", 5, (60,), seed=0)
        strategy = FedAvg(fraction_train=s / n, fraction_evaluate=0.0, min_train_nodes=s, min_available_nodes=n)

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            stamps.append(time.perf_counter())
            return MetricRecord({"round": server_round})

        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds + 1,
                       train_config=ConfigRecord({"num_clients": n, "lr": 0.01}), evaluate_fn=evaluate_fn)

    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": 2, "include_dashboard": False, "logging_level": logging.ERROR,
                             "log_to_driver": False}}
    t0 = time.perf_counter()
    run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=n, backend_config=backend)
    done.set()
    if len(stamps) < rounds + 2:
        raise SystemExit(f"Flower finished {max(len(stamps) - 1, 0)} of {rounds + 1} rounds")
    timed = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return {"wall_s": sum(timed) / len(timed), "startup_s": time.perf_counter() - t0 - sum(timed),
            "peak_mb": peak[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per N (after one untimed)")
    p.add_argument("--s", type=int, default=10)
    p.add_argument("--n", type=int, nargs="+", default=list(NS))
    p.add_argument("--limit", type=float, default=300, help="seconds one N may take before it counts as not done")
    p.add_argument("--max-mb", type=float, default=8000, help="memory (MB) past which one N is stopped")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.s, a.rounds, a.max_mb)))
        return 0
    with open("/proc/loadavg") as f:
        load0 = ", ".join(f.read().split()[:3])
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for n in a.n:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(n), "--s", str(a.s), "--rounds",
               str(a.rounds), "--max-mb", str(a.max_mb)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = proc.communicate(timeout=a.limit)
            done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # the child and Ray's processes under it
            proc.communicate()
            rows.append(f"| {n:,} | not done in {a.limit:.0f} s | | |")
            print(f"  N={n:,}: not done in {a.limit:.0f} s", file=sys.stderr, flush=True)
            break
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
            rows.append(f"| {n:,} | failed: {why} | | |")
            print(f"  N={n:,}: failed\n{done.stderr[-3000:]}", file=sys.stderr, flush=True)
            break
        r = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(f"| {n:,} | {r['wall_s']:.3f} | {r['startup_s']:.1f} | {r['peak_mb']:,.0f} |")
        print(f"  N={n:,}: {r['wall_s']:.3f} s/round, start-up {r['startup_s']:.1f} s, {r['peak_mb']:.0f} MB",
              file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load1 = ", ".join(f.read().split()[:3])
    import flwr
    print("\n".join([f"Measured {began} with `python benchmarks/scale_flower.py --rounds {a.rounds} --s {a.s}` "
                     f"(flwr {flwr.__version__}, Ray, 2 actors × 1 CPU); load average {load0} at the start, "
                     f"{load1} at the end.", "",
                     "| N | s/round (wall) | start-up s | peak RSS MB (process tree) |", "|---:|---:|---:|---:|",
                     *rows]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    sys.exit(main())
