"""Byzantine clients in simulation: which clients are malicious, and what a malicious client sends.

A run has a fixed set M of ⌊f·N⌋ malicious clients (``attack.fraction`` = f), drawn once from the seed
(``rng(seed, ATTACKERS)``), the same in every round. A malicious client that is sampled trains honestly
(its local steps, its client state) and then, for the model-update attacks, replaces its update
Δ_i = x_i − x_t before the server sees it:

- ``sign_flip``: Δ_i → −λ·Δ_i (λ = ``attack.scale``, default 1): the sign-flipping attack of Li, Xu, Chen,
  Giannakis & Ling, "RSA: Byzantine-robust stochastic aggregation methods ...", AAAI 2019.
- ``scale``: Δ_i → λ·Δ_i (default λ = 10): the "explicit boosting" of Bhagoji, Chakraborty, Mittal & Calo,
  "Analyzing federated learning through an adversarial lens", ICML 2019, without its backdoor objective.
- ``gaussian``: Δ_i → ξ with ξ ~ N(0, σ² I) (σ = ``attack.noise_std``), drawn from
  ``rng(seed, t, ATTACK_NOISE, i)``: the Gaussian Byzantine worker of Blanchard, El Mhamdi, Guerraoui &
  Stainer, "Machine learning with adversaries: Byzantine tolerant gradient descent", NeurIPS 2017.
- ``constant``: every coordinate of Δ_i → c (``attack.constant``): RSA's same-value attack.

``label_flip`` is data poisoning instead (Tolpegin, Truex, Gursoy & Liu, "Data poisoning attacks against
federated learning systems", ESORICS 2020): a malicious client trains honestly on its own samples with
labels y → L − 1 − y (``fedsl.data.poisoning.flip_labels``); its update is sent as it is.

Everything is a function of (seed, t, client id), so a resumed run redraws exactly what an uninterrupted
one drew, with nothing in the checkpoint. ``kind = 'none'`` (the default) draws nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsl.core import rng
from fedsl.core.types import Params

KINDS = ("none", "sign_flip", "scale", "gaussian", "label_flip", "constant")
UPDATE_KINDS = ("sign_flip", "scale", "gaussian", "constant")  # the attacks on the update Δ_i (not label_flip)
DEFAULT_SCALE = {"sign_flip": 1.0, "scale": 10.0}  # λ when ``attack.scale`` is left unset
# attack.KEY -> the kinds that read it (another kind's, changed, is refused by the config: it would change nothing)
READS = {"fraction": tuple(k for k in KINDS if k != "none"), "scale": ("sign_flip", "scale"),
         "noise_std": ("gaussian",), "constant": ("constant",)}


@dataclass(frozen=True)
class Attack:
    """What the malicious clients do (see the module docstring).

    Attributes:
        kind: one of ``KINDS``.
        fraction: f, the share of the N clients that are malicious (⌊f·N⌋ of them), in [0, 1).
        scale: λ of sign_flip (Δ → −λ·Δ) and scale (Δ → λ·Δ); None: ``DEFAULT_SCALE``.
        noise_std: σ of gaussian (Δ → N(0, σ²) per coordinate).
        constant: c of constant (every coordinate of Δ → c).
    """

    kind: str = "none"
    fraction: float = 0.0
    scale: float | None = None
    noise_std: float = 1.0
    constant: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"attack kind = {self.kind!r}: expected one of {', '.join(KINDS)}")
        if not 0 <= self.fraction < 1:
            raise ValueError(f"attack fraction = {self.fraction}: expected a fraction in [0, 1)")

    @property
    def on_updates(self) -> bool:
        """Whether malicious clients replace their update Δ_i (every kind but none and label_flip)."""
        return self.kind in UPDATE_KINDS

    @property
    def lam(self) -> float:
        """λ of sign_flip and scale."""
        return self.scale if self.scale is not None else DEFAULT_SCALE.get(self.kind, 1.0)


NO_ATTACK = Attack()


def malicious_count(num_clients: int, fraction: float) -> int:
    """⌊f·N⌋ (with a guard against f·N landing a rounding error below an integer, e.g. 0.29·100)."""
    return min(num_clients, math.floor(fraction * num_clients + 1e-9))


def malicious_clients(seed: int, num_clients: int, attack: Attack) -> np.ndarray:
    """M: the sorted ids of the run's ⌊f·N⌋ malicious clients, drawn once from ``rng(seed, ATTACKERS)``
    (empty for kind 'none': nothing is drawn)."""
    if attack.kind == "none":
        return np.zeros(0, dtype=np.int64)
    k = malicious_count(num_clients, attack.fraction)
    chosen = rng.rng(seed, rng.ATTACKERS).choice(num_clients, size=k, replace=False)
    return np.sort(chosen).astype(np.int64)


def attacked_update(attack: Attack, delta: Params, seed: int, t: int, client: int) -> Params:
    """A malicious client's update in place of its honest Δ_i (``delta``, one client's, not stacked).

    Args:
        attack: the attack (one of ``UPDATE_KINDS``).
        delta: Δ_i = x_i − x_t, the update the client computed honestly.
        seed: the run's seed; gaussian's ξ is drawn from ``rng(seed, t, ATTACK_NOISE, i)`` (float64 on the
            host, the parameters in sorted name order), so it does not depend on the device, the other clients or
            the engine.
        t: the round t.
        client: the client's id i.
    """
    if attack.kind == "sign_flip":
        return {n: -attack.lam * d for n, d in delta.items()}
    if attack.kind == "scale":
        return {n: attack.lam * d for n, d in delta.items()}
    if attack.kind == "constant":
        return {n: torch.full_like(d, attack.constant) for n, d in delta.items()}
    if attack.kind == "gaussian":
        gen = rng.rng(seed, t, rng.ATTACK_NOISE, client)
        out = {}
        for n in sorted(delta):
            d = delta[n]
            xi = torch.from_numpy(gen.standard_normal(tuple(d.shape)))
            out[n] = (attack.noise_std * xi).to(device=d.device, dtype=d.dtype)
        return {n: out[n] for n in delta}
    raise ValueError(f"attack kind = {attack.kind!r} does not change updates: expected one of {UPDATE_KINDS}")


def attack_finals(attack: Attack, x: Params, finals: Params, ids: Sequence[int], malicious: np.ndarray, seed: int,
                  t: int) -> Params:
    """The models the server receives: row j of ``finals`` (x_i of client ``ids[j]``) as it is for an honest
    client, x_t + A(Δ_i) for a malicious one (``attacked_update``).

    Args:
        attack: the run's attack; ``finals`` comes back unchanged (the same object) unless it acts on updates.
        x: x_t, the model the clients started from.
        finals: the clients' final models x_i, stacked [S, ...].
        ids: the clients' ids, in the order of ``finals``' rows.
        malicious: M, the run's malicious ids (``malicious_clients``).
        seed: the run's seed.
        t: the round.
    """
    bad = set(malicious.tolist())
    rows = [j for j, i in enumerate(ids) if int(i) in bad]
    if not attack.on_updates or not rows:
        return finals
    out = {n: v.clone() for n, v in finals.items()}
    for j in rows:
        delta = {n: finals[n][j] - p for n, p in x.items()}
        new = attacked_update(attack, delta, seed, t, int(ids[j]))
        for n, p in x.items():
            out[n][j] = p + new[n]
    return out
