"""Metrics of the paper (Section 4.1, 'Evaluations'), on per-round accuracy curves.

- rolling accuracy: mean over a window of 20 rounds (the paper's smoothing);
- final accuracy: the rolling accuracy at the last round;
- rise time: the first round whose rolling accuracy reaches 90% of the final accuracy;
- T_a: the first round whose rolling accuracy reaches a (e.g. T_0.5 in Table 1);
- mean and std over seeds.

Curves are given as (rounds, values); rounds need not be consecutive (``eval_every``):
the window covers the evaluated rounds r' with r - window < r' <= r. Times (rise time, T_a)
are then known to within the evaluation period: ``time_resolution``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

WINDOW = 20


def _arrays(rounds: Sequence[int], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rounds, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if r.shape != v.shape or r.ndim != 1:
        raise ValueError(f"rounds and values must be 1-D of equal length, got {r.shape} and {v.shape}")
    if len(r) > 1 and np.any(np.diff(r) <= 0):
        raise ValueError("rounds must be strictly increasing")
    return r, v


def _check(rounds: Sequence[int], values: Sequence[float], window: int) -> None:
    if window < 1:
        raise ValueError(f"window = {window}: expected an integer >= 1")
    _arrays(rounds, values)


def rolling(rounds: Sequence[int], values: Sequence[float], window: int = WINDOW) -> np.ndarray:
    """Mean of the values at rounds in (r - window, r], for each evaluated round r.

    Each window is summed on its own, left to right, so a window's mean depends only on the
    values inside it, bit for bit: a run evaluated sparsely but at every round of its final
    window has the same final accuracy as one evaluated every round (a running cumulative sum
    would carry the round-off of everything before the window).
    """
    if window < 1:
        raise ValueError(f"window = {window}: expected an integer >= 1")
    r, v = _arrays(rounds, values)
    start = np.searchsorted(r, r - window, side="right")  # first index inside the window
    count = np.arange(1, len(r) + 1) - start
    total = np.zeros(len(r))
    for j in range(int(count.max()) if len(r) else 0):  # j-th value of each window, for those that have one
        has = count > j
        total[has] += v[start[has] + j]
    return total / np.maximum(count, 1)


def final_accuracy(rounds: Sequence[int], acc: Sequence[float], window: int = WINDOW) -> float:
    """Rolling accuracy at the last evaluated round (NaN for an empty curve)."""
    _check(rounds, acc, window)
    if len(acc) == 0:
        return float("nan")
    return float(rolling(rounds, acc, window)[-1])


def first_round_reaching(rounds: Sequence[int], curve: Sequence[float], level: float) -> int | None:
    """The first round whose value is >= level, or None if never."""
    r, v = _arrays(rounds, curve)
    hit = np.nonzero(v >= level)[0]
    return int(r[hit[0]]) if len(hit) else None


def rise_time(rounds: Sequence[int], acc: Sequence[float], window: int = WINDOW, fraction: float = 0.9) -> int | None:
    """First round whose rolling accuracy reaches ``fraction`` (90%) of the final accuracy."""
    _check(rounds, acc, window)
    if len(acc) == 0:
        return None
    roll = rolling(rounds, acc, window)
    return first_round_reaching(rounds, roll, fraction * roll[-1])


def rounds_to_accuracy(rounds: Sequence[int], acc: Sequence[float], level: float, window: int = WINDOW) -> int | None:
    """T_a: first round whose rolling accuracy reaches ``level`` (None if never)."""
    _check(rounds, acc, window)
    if len(acc) == 0:
        return None
    return first_round_reaching(rounds, rolling(rounds, acc, window), level)


def time_resolution(rounds: Sequence[int]) -> int | None:
    """The largest gap between evaluated rounds: rise time and T_a are exact to within this many rounds
    (a time t found on such a curve means: reached at some round in (t - resolution, t]). None if < 2 rounds."""
    r, _ = _arrays(rounds, np.zeros(len(rounds)))
    return int(np.diff(r).max()) if len(r) > 1 else None


def summarize(rounds: Sequence[int], acc: Sequence[float], window: int = WINDOW,
              levels: Sequence[float] = (0.5,)) -> dict[str, float | int | None]:
    """final_accuracy, rise_time and T_<a> for each level, and the times' resolution, as a flat dict."""
    out: dict[str, float | int | None] = {
        "final_accuracy": final_accuracy(rounds, acc, window),
        "rise_time": rise_time(rounds, acc, window),
        "time_resolution": time_resolution(rounds),
    }
    for a in levels:
        out[f"T_{a:g}"] = rounds_to_accuracy(rounds, acc, a, window)
    return out


def mean_std(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and sample std (n − 1 in the denominator) over seeds, ignoring None; std 0 for one value (no
    spread measured: tables then show the mean alone); (nan, nan) if nothing is left."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if len(v) == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0
