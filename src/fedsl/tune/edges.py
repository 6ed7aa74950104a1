"""Edges: a study's best value at the edge of its range says the optimum may lie outside it.

A value is *at an edge* when it lies within ``EDGE_SHARE`` (5%) of the range's width from an end, measured on the
log scale for a log range. An edge is *hard* when the hyper-parameter may not pass it (``Range.hard_low`` /
``hard_high``: a probability's 0, β < 1, the paper's budget of steps) or the config refuses the value beyond it;
otherwise the study widens the range on that side (``widen``: a decade where log, the range's width where linear,
an integer range at least by one) and runs ``tune.edge_trials`` more trials (``fedsl.tune``), up to
``tune.edge_widenings`` times. Whatever still lies at an edge is reported (``best.json``, ``fedsl show``, the
tables): ``at_edges`` says which, and whether it is hard.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

from fedsl.algorithms.spec import Range

EDGE_SHARE = 0.05  # of the (log-)range: within it of an end, a value is at that edge


def position(entry: Range, value: float) -> float:
    """Where ``value`` lies in ``entry``: 0 at low, 1 at high (on the log scale for a log range)."""
    if entry.log:
        return (math.log(value) - math.log(entry.low)) / (math.log(entry.high) - math.log(entry.low))
    return (value - entry.low) / (entry.high - entry.low)


def at_edges(space: dict[str, Any], values: dict[str, Any]) -> dict[str, str]:
    """The keys of ``values`` (a trial's) that lie at an edge of their range in ``space``: key -> 'low' or 'high',
    with ' (hard)' where the range may not be widened on that side; a choice among numbers (a grid's list) at its
    smallest or largest: ' (of the list)', reported only."""
    out = {}
    for key, entry in space.items():
        if key not in values:
            continue
        numbers = isinstance(entry, list) and len(entry) > 1 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry)
        if numbers and values[key] in (min(entry), max(entry)):  # a grid's end: reported, never widened
            out[key] = ("low" if values[key] == min(entry) else "high") + " (of the list)"
        if not isinstance(entry, Range):
            continue
        where = position(entry, float(values[key]))
        side = "low" if where <= EDGE_SHARE else "high" if where >= 1 - EDGE_SHARE else None
        if side is not None:
            hard = entry.hard_low if side == "low" else entry.hard_high
            out[key] = side + (" (hard)" if hard else "")
    return out


def widened(entry: Range, side: str) -> Range | None:
    """``entry`` widened on ``side`` ('low' or 'high'): a decade where log, its width where linear, an integer
    range by at least one (and not below 1 where log); None when that side is hard or cannot move."""
    if (entry.hard_low if side == "low" else entry.hard_high):
        return None
    low, high = entry.low, entry.high
    if entry.log:
        low, high = (low / 10, high) if side == "low" else (low, high * 10)
    else:
        width = high - low
        low, high = (low - width, high) if side == "low" else (low, high + width)
    if entry.integer:
        low, high = math.floor(low), math.ceil(high)
        if entry.log:
            low = max(1, low)
    if (low, high) == (entry.low, entry.high):
        return None
    return replace(entry, low=float(low), high=float(high))


def widen(space: dict[str, Any], best: dict[str, Any], allowed: Callable[[str, float], bool]
          ) -> tuple[dict[str, Any], dict[str, str]]:
    """``space`` with each range whose ``best`` value lies at an edge that is not hard widened on that side;
    ``allowed(key, value)``: whether the config accepts the new end (a refused end makes that side hard). Returns
    the new space and what was done, key -> 'low 0.001 -> 0.0001' (or '... hard: not widened')."""
    space, done = dict(space), {}
    for key, edge in at_edges(space, best).items():
        if not isinstance(space[key], Range):
            continue
        side = edge.split()[0]
        entry = space[key]
        new = widened(entry, side)
        end = None if new is None else (new.low if side == "low" else new.high)
        if new is None or not allowed(key, int(end) if entry.integer else end):
            space[key] = replace(entry, **{f"hard_{side}": True})
            done[key] = f"{side} {getattr(entry, side):g}: hard, not widened"
            continue
        space[key] = new
        done[key] = f"{side} {getattr(entry, side):g} -> {end:g}"
    return space, done


def to_json(space: dict[str, Any]) -> dict[str, Any]:
    """The ranges of ``space`` as plain tables (kept in the study, so that a resumed study searches the same)."""
    return {k: {"low": e.low, "high": e.high, "log": e.log, "integer": e.integer, "hard_low": e.hard_low,
                "hard_high": e.hard_high} for k, e in space.items() if isinstance(e, Range)}


def from_json(space: dict[str, Any], ranges: dict[str, Any]) -> dict[str, Any]:
    """``space`` with the ranges ``to_json`` kept over it."""
    return {**space, **{k: Range(**r) for k, r in ranges.items() if k in space}}
