"""Benchmark harness: fedsl's engine vs a plain PyTorch loop vs Flower's and pfl-research's simulations.

    from harness import run_benchmarks
    report = run_benchmarks(["s2-cifar10+eval"], rounds=3, reps=3)
    print(report.markdown())

For each workload (``harness.workloads``, random data) every available peer (``harness.peers``,
``harness.percore``, ``harness.flower_peer``, ``harness.pfl_peer``) is set up and warmed up (one
untimed round), then run ``reps`` times in turn — fedsl, plain loop, Flower, fedsl, ... — each time
for a few timed rounds, so that noise from other work on the machine hits all alike. A
row reports the median seconds per round, samples/s, its speed ratio to each other peer,
achieved GFLOP/s (FLOPs counted by ``FlopCounterMode``) and their fraction of the
machine's best rate measured in the same process (``harness.machine.best_rates``), and
peak memory; under the table, each workload's floor: its FLOPs per round at those best rates.
Also measured: the per-client state of SCAFFOLD and FedDyn for N = 1,000 CIFAR
clients (``state_footprint``).

The modules, one job each: ``run`` (the timing loop over peers and workloads), ``report`` (what one invocation
measured, as Markdown), ``footprint`` (the clients' state memory), ``peers`` / ``percore`` / ``flower_peer`` /
``pfl_peer`` (the implementations compared), ``workloads``, ``machine`` (best rates), ``table``, ``command``.

Not part of the library: it lives beside ``benchmarks/bench.py``, which puts ``benchmarks/``
on ``sys.path`` and runs it (with only torch and numpy installed:
``PYTHONPATH=src python3 benchmarks/bench.py --device cuda``).
"""

from harness.footprint import state_footprint
from harness.report import Report
from harness.run import OPTIONAL_PEERS, PEERS, TEXT_RATE_BATCHES, run_benchmarks

__all__ = ["OPTIONAL_PEERS", "PEERS", "TEXT_RATE_BATCHES", "Report", "run_benchmarks", "state_footprint"]
