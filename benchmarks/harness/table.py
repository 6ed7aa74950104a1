"""Rows of the benchmark and their Markdown table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

COLUMNS = ["workload", "peer", "s/round", "samples/s", "x fedsl", "x plain loop", "x loop cl", "x loop/core",
           "x flower", "x pfl", "GFLOP/s", "% of best", "peak MB", "note"]
# column -> the peer (row name) it compares with; "x plain loop" is the plain loop in its default layout
RATIO_PEERS = {"x fedsl": "fedsl", "x plain loop": "plain loop", "x loop cl": "loop channels-last",
               "x loop/core": "loop 1 proc/core", "x flower": "flower", "x pfl": "pfl"}


@dataclass
class Row:
    """One peer on one workload.

    Attributes:
        seconds: median seconds per round over all timed rounds (None: not run).
        times: every timed round's seconds.
        samples: samples processed per round (training fwd+bwd + evaluation fwd).
        flops: FLOPs per round (from FlopCounterMode's per-sample counts).
        best_seconds: the time the same samples would take at the machine's best measured
            training and inference rates of the model.
        peak_mb: peak memory (MiB): process RSS, or CUDA memory allocated on a GPU.
        ratios: filled by ``add_ratios``: peer -> that peer's seconds / this row's seconds
            (> 1: this row is faster).
    """

    workload: str
    peer: str
    seconds: float | None = None
    times: list[float] = field(default_factory=list)
    samples: float = 0.0
    flops: float = 0.0
    best_seconds: float = 0.0
    peak_mb: float | None = None
    note: str = ""
    settings: str = ""
    ratios: dict[str, float] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.seconds else None

    @property
    def gflops(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.seconds else None

    @property
    def fraction_of_best(self) -> float | None:
        return self.best_seconds / self.seconds if self.seconds else None


def add_ratios(rows: list[Row]) -> None:
    """For each workload, every row's speed ratio to every other peer's row: t_peer / t_row."""
    by_workload: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, {})[r.peer] = r
    for peers in by_workload.values():
        for r in peers.values():
            r.ratios = {}
            for name, other in peers.items():
                if other is not r and r.seconds and other.seconds:
                    r.ratios[name] = other.seconds / r.seconds


def floors(rows: list[Row]) -> list[str]:
    """One line per workload: its FLOPs per round and the floor, the seconds they take at the best measured
    rates (training FLOPs / the best fwd+bwd rate + evaluation FLOPs / the best inference rate)."""
    seen: dict[str, Row] = {}
    for r in rows:
        if r.best_seconds > 0:
            seen.setdefault(r.workload, r)
    if not seen:
        return []
    out = ["Floor per round (the round's FLOPs at the best measured rates below; `% of best` = floor / s/round):", ""]
    for name, r in seen.items():
        out.append(f"- {name}: {r.flops / 1e9:.3g} GFLOP at {r.flops / r.best_seconds / 1e9:.3g} GFLOP/s "
                   f"= {_fmt(r.best_seconds, 3)} s")
    return out


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{max(digits - len(str(int(abs(v)))), 0)}f}".rstrip(".")


def cells(r: Row) -> list[str]:
    def ratio(peer: str) -> str:
        v = r.ratios.get(peer)
        return f"{v:.2f}x" if v is not None else ""
    frac = r.fraction_of_best
    return [r.workload, r.peer, _fmt(r.seconds, 3), _fmt(r.samples_per_s, 4),
            *(ratio(p) for p in RATIO_PEERS.values()),
            _fmt(r.gflops, 3), f"{100 * frac:.0f}%" if frac is not None else "-",
            _fmt(r.peak_mb, 4), r.note]


def markdown(rows: list[Row]) -> str:
    """The table: one line per (workload, peer); ratios read "this row is N x faster than PEER"."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" if c not in ("workload", "peer", "note")
                                                               else "---" for c in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells(r)) + " |")
    return "\n".join(lines)
