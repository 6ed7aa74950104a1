"""How many torch intra-op threads a run uses when the config says ``threads = 0`` (automatic).

torch's default is one thread per physical core of the whole machine, whatever else runs on
it. On a small machine with other work, threads that spin waiting on each other make a round
many times slower than one thread, and many processes each with that default slow each other
far beyond their fair share (benchmarks/RESULTS.md). ``auto_threads`` therefore takes the smallest of

- torch's current setting (so a caller's ``torch.set_num_threads`` is never raised),
- the cores this process may use (``os.sched_getaffinity``: taskset, cgroups' cpusets, Slurm),
- ``OMP_NUM_THREADS`` when set (what a batch scheduler or Ray gives a task),
- the cores divided by the runs fedsl runs side by side (``FEDSL_CONCURRENT_RUNS``, set by
  ``fedsl run --parallel N`` for its workers),
- the cores the machine's load leaves free (1-minute load average, rounded; at least 1),

decided once per process, so that every run of a process uses the same number (float sums,
and so results to the last bit, depend on it: set ``threads = N`` for bit-identical results
across machines and loads). It is at least 1.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

CONCURRENT_ENV = "FEDSL_CONCURRENT_RUNS"

_chosen: int | None = None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _positive_int(text: str | None) -> int | None:
    try:
        v = int(text) if text is not None else None
    except ValueError:
        return None
    return v if v is not None and v > 0 else None


def choose_threads(current: int, cores: int, omp: int | None = None, concurrent: int = 1,
                   load: float | None = None, machine_cores: int | None = None) -> int:
    """The rule, as a pure function (see the module's doc): the smallest of the limits, at least 1."""
    n = min(current, cores)
    if omp:
        n = min(n, omp)
    n = min(n, max(1, cores // max(1, concurrent)))
    if load is not None:
        free = (machine_cores or cores) - load
        n = min(n, max(1, int(free + 0.5)))
    return max(1, n)


def auto_threads() -> int:
    """The number of threads for ``threads = 0``, chosen at the first call in this process."""
    global _chosen
    if _chosen is None:
        import torch
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # pragma: no cover - not POSIX
            load = None
        _chosen = choose_threads(torch.get_num_threads(), usable_cores(),
                                 _positive_int(os.environ.get("OMP_NUM_THREADS")),
                                 _positive_int(os.environ.get(CONCURRENT_ENV)) or 1, load, os.cpu_count())
    return _chosen


def apply(threads: int) -> int:
    """Set torch's intra-op threads for a run whose config says ``threads`` (0 = automatic);
    returns the number in use. Automatic only ever lowers torch's current setting."""
    import torch
    n = threads or min(auto_threads(), torch.get_num_threads())
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 inside, the caller's setting restored after.

    For many small element-wise operations in a row (a pool converted piece by piece): each would open a
    parallel region whose threads wait on each other, which on a busy machine cost 30 times the work
    itself; one thread gives the same numbers (element-wise results do not depend on the threads).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
