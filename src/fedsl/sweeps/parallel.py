"""A sweep's runs side by side on this machine: ``fedsl run --parallel N`` (and ``fedsl resume``).

Design (measured in ``benchmarks/bench_parallel.py``, results in ``benchmarks/RESULTS.md``):
a pool of N worker processes (``spawn``, so no torch or OpenMP state is inherited), each
running one unit of the group at a time (one run, or a stack of runs on a GPU) with
``cores / N`` torch threads (``FEDSL_CONCURRENT_RUNS``, see ``fedsl.core.threads``).
Workers write into the group folder themselves, exactly the files a serial run writes; the
driver (the ``fedsl`` process) shows the sweep's progress and collects the summaries. A
process pool starts in seconds and needs nothing beyond the standard library; a local Ray
(``--ray local``) does the same with Ray's scheduler.

With one thread per run, results are bit-identical to a serial run with ``threads = 1``.
Ctrl-C or SIGTERM: every worker checkpoints its run (status ``interrupted``) and
``fedsl resume`` continues the group, in parallel or not.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

from fedsl.core.threads import CONCURRENT_ENV, usable_cores

Log = Callable[[str], None]


def default_workers() -> int:
    """One worker per core this process may use."""
    return usable_cores()


def _init_worker(workers: int, quiet: bool) -> None:
    os.environ[CONCURRENT_ENV] = str(workers)
    # Ctrl-C reaches every process of the terminal's group: the driver alone decides, and
    # sends the workers SIGTERM (their runs then checkpoint, see ``_work``)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # An idle worker waits for its next unit holding the pool's call-queue lock; killed there by
    # SIGTERM's default action, it would take the lock with it, and the busy workers, once their runs
    # checkpoint, would wait for it forever (so would the driver's shutdown). Outside a unit, SIGTERM
    # only marks the worker as stopping: it then starts no run and leaves when the pool shuts down.
    signal.signal(signal.SIGTERM, _mark_stopping)
    global _QUIET
    _QUIET = quiet


_QUIET = False
_STOPPING = False
# seconds the runs of an interrupted sweep have to write their final checkpoints before their workers are killed
STOP_GRACE_S = 60.0


def _mark_stopping(signum, frame) -> None:
    global _STOPPING
    _STOPPING = True


def _work(out: str, names: list[str], cfgs: list[dict], resume: bool) -> dict[str, dict]:
    """In a worker: run one unit into ``out`` (SIGTERM: the runs checkpoint as interrupted)."""
    from fedsl.config.schema import validate
    from fedsl.runs.interrupts import terminate_as_interrupt
    from fedsl.sweeps.compare import run_unit

    def log(s: str) -> None:
        if not _QUIET:
            print(s, flush=True)

    with terminate_as_interrupt():
        if _STOPPING:  # SIGTERM came while this worker was idle or importing: the unit does not start
            from fedsl.runs.results import RunDir
            return {n: RunDir(Path(out) / n).read_summary() for n in names}
        return run_unit(Path(out), names, [validate(c) for c in cfgs], resume=True, log=log, progress=False)


def describe(summary: dict) -> str:
    acc = summary.get("final_accuracy")
    return f"{summary.get('status', 'no summary')}" + (f", final accuracy {acc:.4f}" if isinstance(acc, float) else "")


class LocalPool:
    """Run a group's units in ``workers`` processes on this machine."""

    def __init__(self, workers: int, quiet: bool = False) -> None:
        self.workers = max(1, workers)
        self.quiet = quiet

    def __repr__(self) -> str:
        return f"LocalPool({self.workers})"

    def run_units(self, out: Path, units: list[tuple[list[str], list]], *, resume: bool, log: Log = print
                  ) -> dict[str, dict]:
        """Run ``units`` ((run names, their configs) each) side by side; run name -> summary.

        ``resume`` is implied per run (a run folder with a config continues from its checkpoint).
        """
        if not units:
            return {}
        from fedsl.runs.results import RunDir
        total = sum(len(n) for n, _ in units)
        n_workers = min(self.workers, len(units))
        per = max(1, usable_cores() // self.workers)
        log(f"running {total} run{'s' if total != 1 else ''} in {n_workers} worker processes "
            f"({per} torch thread{'s' if per > 1 else ''} each)")
        summaries: dict[str, dict] = {}
        pool = ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.workers, self.quiet))
        t0 = time.monotonic()
        # One unit per worker at a time, the next submitted when one ends: a pool given every unit at
        # once queues the next ones inside the workers' call queue, where they can no longer be cancelled,
        # so a SIGTERM'd sweep went on to run them to the end (seen: two 20-minute runs after a SIGTERM)
        queue = list(units)
        futures: dict = {}

        def submit():
            names, cfgs = queue.pop(0)
            f = pool.submit(_work, str(out), names, [c.model_dump() for c in cfgs], resume)
            futures[f] = names
            return f

        try:
            for _ in range(n_workers):
                submit()
            left, stopped = set(futures), False
            while left:
                done, left = wait(left, return_when=FIRST_COMPLETED)
                for f in done:
                    names = futures[f]
                    try:
                        got = f.result()
                    except Exception as e:  # noqa: BLE001 — a worker died (kill -9, out of memory): recorded
                        log(f"{', '.join(names)}: worker failed ({type(e).__name__}: {e}); "
                            "`fedsl resume` continues from the last checkpoint")
                        got = {n: RunDir(out / n).read_summary() for n in names}
                    summaries.update(got)
                    for n in names:
                        log(f"[{len(summaries)}/{total} runs, {time.monotonic() - t0:.0f} s] {n}: "
                            f"{describe(got.get(n, {}))}")
                    # a run interrupted in a worker (its SIGTERM came first, or alone): start nothing new
                    stopped = stopped or any(got.get(n, {}).get("status") == "interrupted" for n in names)
                    if queue and not stopped:
                        try:
                            left.add(submit())
                        except BrokenProcessPool:  # a worker was killed: the pool takes no more work
                            stopped = True
                            log(f"the worker pool is broken: {sum(len(n) for n, _ in queue)} runs not started; "
                                f"`fedsl resume {out}` continues")
                            queue.clear()
            if stopped and queue:
                log(f"a run was interrupted: {sum(len(n) for n, _ in queue)} runs not started; "
                    f"continue with: fedsl resume {out}")
        except BaseException:
            # Ctrl-C / SIGTERM of the driver: the workers checkpoint their runs and stop
            self._stop(pool, set(futures))
            raise
        pool.shutdown(wait=True)
        return summaries

    @staticmethod
    def _stop(pool: ProcessPoolExecutor, futures: set) -> None:
        """SIGTERM every worker (a busy one checkpoints its run, an idle one starts nothing), give the
        runs ``STOP_GRACE_S`` to write their checkpoints, then end the pool; a worker still alive after
        that (stuck, or killed mid-queue by someone else) is killed so the driver always exits."""
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except (ProcessLookupError, AttributeError):
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        wait(futures, timeout=STOP_GRACE_S)
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
