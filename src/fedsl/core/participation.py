"""Partial participation and stragglers: who can be sampled in round t, and what the sampled clients deliver.

Availability (``algorithm.availability`` = p, ``algorithm.availability_pattern``):

- ``bernoulli``: each round, client i is available with probability p, independently of the other rounds
  (``rng(seed, t, AVAILABILITY)``, one uniform per client).
- ``fixed``: client i is available in a fixed fraction p of the rounds, evenly spread: in round t iff
  ⌊(t+1)·p + u_i⌋ > ⌊t·p + u_i⌋, with its phase u_i ~ U[0, 1) drawn once from the seed
  (``rng(seed, AVAILABILITY_PHASE)``). For p = 1/k a client is available every k-th round, the clients
  staggered by their phases (a device that is online on a schedule).

The server samples S of the available clients (``rng(seed, t, SAMPLE_AVAILABLE)``), all of them when fewer
than S are available, none when none is (the round is then x̄ = x_t, followed by server learning).

Stragglers (``algorithm.straggler_fraction`` = f, ``algorithm.straggler_mode``): round(f·s) of the s sampled
clients, drawn from ``rng(seed, t, STRAGGLERS)``, straggle. ``partial``: a straggler does only its first
k'_i = 1 + ⌊u·(K_i − 1)⌋ of its K_i steps, u ~ U[0, 1) (at least 1 step, fewer than K_i when K_i > 1).
``drop``: the straggler trains but its update never reaches the server (left out of the aggregate).

Everything is a function of (seed, t) alone (and the client ids), so a resumed run redraws exactly what an
uninterrupted one drew, with nothing more in the checkpoint. p = 1 and f = 0 (the defaults) draw nothing:
``sample`` is then ``rng.sample_clients`` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsl.core import rng

PATTERNS = ("bernoulli", "fixed")
STRAGGLER_MODES = ("partial", "drop")


@dataclass(frozen=True)
class Participation:
    """How clients take part in rounds: availability p and its pattern, straggler fraction f and mode."""

    availability: float = 1.0  # p in (0, 1]
    pattern: str = "bernoulli"  # one of PATTERNS
    straggler_fraction: float = 0.0  # f in [0, 1)
    straggler_mode: str = "partial"  # one of STRAGGLER_MODES

    def __post_init__(self) -> None:
        if not 0 < self.availability <= 1:
            raise ValueError(f"availability = {self.availability}: expected a probability in (0, 1]")
        if self.pattern not in PATTERNS:
            raise ValueError(f"availability pattern = {self.pattern!r}: expected one of {', '.join(PATTERNS)}")
        if not 0 <= self.straggler_fraction < 1:
            raise ValueError(f"straggler fraction = {self.straggler_fraction}: expected a fraction in [0, 1)")
        if self.straggler_mode not in STRAGGLER_MODES:
            raise ValueError(f"straggler mode = {self.straggler_mode!r}: expected one of "
                             f"{', '.join(STRAGGLER_MODES)}")

    @property
    def full(self) -> bool:
        """Every client always available and no straggler: the paper's setting, and nothing extra is drawn."""
        return self.availability == 1 and self.straggler_fraction == 0


FULL = Participation()


def available(seed: int, t: int, num_clients: int, p: float, pattern: str) -> np.ndarray:
    """The ids of the clients available in round t, sorted."""
    if p == 1:
        return np.arange(num_clients)
    if pattern == "bernoulli":
        mask = rng.rng(seed, t, rng.AVAILABILITY).random(num_clients) < p
    else:  # fixed: the client's cycle, from its phase u_i (the same every round)
        u = rng.rng(seed, rng.AVAILABILITY_PHASE).random(num_clients)
        mask = np.floor((t + 1) * p + u) > np.floor(t * p + u)
    return np.flatnonzero(mask)


def sample(seed: int, t: int, num_clients: int, per_round: int, part: Participation = FULL) -> np.ndarray:
    """Round t's sampled clients, sorted: S of N (``rng.sample_clients``) or, with availability p < 1, S of
    the available ones (all of them when fewer are available; possibly none)."""
    if part.availability == 1:
        return rng.sample_clients(seed, t, num_clients, per_round)
    ids = available(seed, t, num_clients, part.availability, part.pattern)
    if len(ids) <= per_round:
        return ids
    return np.sort(rng.rng(seed, t, rng.SAMPLE_AVAILABLE).choice(ids, size=per_round, replace=False))


def stragglers(seed: int, t: int, ids: np.ndarray, steps: tuple[int, ...], part: Participation = FULL
               ) -> tuple[tuple[int, ...], frozenset[int]]:
    """What round t's sampled clients ``ids`` (with their planned K_i ``steps``) deliver: the steps each does
    (a partial straggler fewer) and the ids whose update never arrives (drop mode)."""
    s = len(ids)
    m = math.floor(part.straggler_fraction * s + 0.5)
    if m == 0:
        return tuple(steps), frozenset()
    gen = rng.rng(seed, t, rng.STRAGGLERS)
    who = np.sort(gen.choice(s, size=m, replace=False))
    if part.straggler_mode == "drop":
        return tuple(steps), frozenset(int(ids[j]) for j in who)
    u = gen.random(m)
    done = list(steps)
    for j, uj in zip(who, u):
        done[j] = 1 + math.floor(uj * (steps[j] - 1))
    return tuple(done), frozenset()
