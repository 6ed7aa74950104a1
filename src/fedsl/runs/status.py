"""What `fedsl show` says of a run whose summary.json is missing or behind its files.

A run writes summary.json when it ends: a run killed (kill -9, a power cut, an out-of-memory kill) has none, or
still the one of an earlier interruption, and so does a run in progress. Its folder still says where it is:

- running: a fedsl process holds the lock of its folder or of its group's (``results.folder_lock``); its rounds
  are those of metrics.csv's last row;
- interrupted: no process holds it; its rounds done are its checkpoint's round (where `fedsl resume` continues,
  dropping the rows after it), and its metrics are those summary.json would hold had it been stopped there (Ctrl-C):
  ``metrics.summarize`` over metrics.csv's rows up to that round, with the config's rolling window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsl.engine import metrics
from fedsl.runs.results import CorruptCheckpoint, RunDir

FINISHED = ("completed", "diverged")


def in_use(path: str | Path) -> bool:
    """Whether a fedsl process holds ``path/.lock`` (``results.folder_lock``) now. Probed with a shared lock taken
    and dropped at once: a `fedsl run` or `resume` starting on the folder in that instant is told it is in use. False
    where ``fcntl`` does not exist (Windows), as nothing is locked there."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return False
    lock = Path(path) / ".lock"
    if not lock.is_file():
        return False
    try:
        with open(lock) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:  # unreadable: nothing to tell
        return False
    return False


def shown_summary(rd: RunDir) -> dict[str, Any]:
    """summary.json of run folder ``rd``; for a run that summary.json does not describe (none, or one behind its
    checkpoint), its status ('running' or 'interrupted'), rounds done and metrics from its other files (module
    docstring)."""
    summary = rd.read_summary()
    if summary.get("status") in FINISHED or not rd.is_run():
        return summary
    running = in_use(rd.path) or in_use(rd.path.parent)
    try:
        kept = rd.checkpoint_round() or 0
    except CorruptCheckpoint:  # `fedsl resume` says what to do in one line; here the run is shown without rounds
        return {**summary, "status": "running" if running else "interrupted", "rounds_done": None}
    if not running and summary.get("status") and summary.get("rounds_done") == kept:
        return summary  # stopped by Ctrl-C or SIGTERM: summary.json is of its last round
    rows = [r for r in rd.read_metrics() if r["round"] > 0 and (running or r["round"] <= kept)]
    window = rd.read_config().get("rolling_window", metrics.WINDOW)
    derived = metrics.summarize([r["round"] for r in rows], [r["accuracy"] for r in rows], window)
    done = (rows[-1]["round"] if rows else 0) if running else kept
    wall = rows[-1].get("wall_time") if rows else None
    return {**summary, **derived, "status": "running" if running else "interrupted", "rounds_done": done,
            "wall_time": wall}
