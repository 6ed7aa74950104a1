"""Privacy accounting of DP-FedAvg's rounds with Google's ``dp-accounting`` library (the ``privacy`` extra).

Each round is one sampled Gaussian mechanism: the clipped sum has add/remove-one-client sensitivity C and
gets N(0, z²C² I), so its noise multiplier is z; a client takes part with probability q = S/N. T rounds are
T compositions of ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, accounted by Rényi DP (Mironov, Talwar,
Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019; the accountant of Abadi et al.,
CCS 2016, with a tighter conversion to (ε, δ)) or by privacy loss distributions (Koskela, Jälkö, Honkela,
AISTATS 2020; Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, PETS 2022), the tighter of the two.

Sampling: fedsl samples exactly S of the N clients each round, uniformly without replacement
(``fedsl.core.rng.sample_clients``), and the accountant is told Poisson sampling at rate q = S/N. That
is the approximation of DP-SGD and DP-FedAvg practice (Abadi et al. 2016 and McMahan et al. 2018 account
fixed-size batches and cohorts this way); it is not a proof for fixed-size sampling, whose ε under
add/remove-one can be larger (Lebeda, Regehr, Kamath, Steinke, "Avoiding Pitfalls for Privacy Accounting
of Subsampled Mechanisms under Composition", 2024). The library's accountant for sampling without
replacement (``SampledWithoutReplacementDpEvent``, RDP only) bounds the replace-one-client relation, not
add/remove-one, which is why it is not used here. docs/how-to/privacy.md says the same for users.

The library is imported when first needed, so fedsl runs without it when privacy is off.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
INSTALL = "pip install 'fedsl[privacy]'"

# The noise multipliers calibration searches: at z = 0.1 ten rounds at q = 10⁻⁴ already give ε ≈ 110 at
# δ = 1e-5 (one round at q = 0.5: 94), so a target that Z_MIN meets asks for next to no privacy.
Z_MIN = 0.1
Z_TOL = 1e-4  # calibration's tolerance on z (the library's guarantee: ε ≤ target at the z returned)


class AccountingUnavailable(ImportError):
    """dp-accounting is not installed; the message is one line naming the extra."""


def library() -> Any:
    """The ``dp_accounting`` module, or AccountingUnavailable naming the extra to install."""
    try:
        return importlib.import_module("dp_accounting")
    except ImportError:
        raise AccountingUnavailable("privacy.clip is set: accounting ε needs the dp-accounting package, which is not "
                                    f"installed here: {INSTALL}") from None


def default_delta(num_clients: int) -> float:
    """δ = min(10⁻⁵, 1/N^1.1): below 1/N at every N (a mechanism that publishes one client's data outright
    with probability δ then exposes fewer than one client in expectation), 10⁻⁵ (Abadi et al. 2016) for
    federations below ≈ 35,000 clients and 1/N^1.1 above (δ shrinking faster than 1/N)."""
    return min(1e-5, float(num_clients) ** -1.1)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The RDP accountant logs a warning for each order whose series does not converge at small z (it leaves
    that order out, and ε stays a valid bound from the others): not the user's concern, so not on their screen."""
    log = logging.getLogger("absl")
    before = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(before)


def _accountant(kind: str) -> Any:
    dp = library()
    if kind == "rdp":
        return dp.rdp.RdpAccountant()
    if kind == "pld":
        return dp.pld.PLDAccountant()
    raise ValueError(f"accountant = {kind!r}: expected one of {ACCOUNTANTS}")


def _rounds_event(q: float, noise_multiplier: float, rounds: int) -> Any:
    dp = library()
    return dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(noise_multiplier)), rounds)


@functools.lru_cache(maxsize=4096)
def epsilon(q: float, noise_multiplier: float, rounds: int, delta: float, accountant: str = "rdp") -> float:
    """ε of ``rounds`` rounds of DP-FedAvg at δ (module docstring): z = ``noise_multiplier``, q = S/N.

    Args:
        q: the sampling rate S/N.
        noise_multiplier: z (0: no noise, ε = ∞).
        rounds: t, rounds composed (0: ε = 0).
        delta: δ.
        accountant: "rdp" or "pld".
    Returns:
        ε (math.inf without noise).
    """
    if rounds == 0 or q == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    with _quiet():
        return float(_accountant(accountant).compose(_rounds_event(q, noise_multiplier, rounds)).get_epsilon(delta))


class CalibrationError(ValueError):
    """No noise multiplier in the searched range meets the target; the message is one line."""


@functools.lru_cache(maxsize=256)
def calibrate(q: float, rounds: int, target_epsilon: float, delta: float, accountant: str = "rdp") -> float:
    """The smallest z (to ``Z_TOL``) with ε(q, z, rounds, δ) ≤ ``target_epsilon``, by the library's
    ``calibrate_dp_mechanism`` (Brent's method on ε(z) − target; the z it returns has ε ≤ target).
    ``target_epsilon`` = ∞: z = 0 (no noise).

    PLD: RDP's z first (RDP bounds ε from above, so PLD needs at most that z), then PLD's within a bracket
    below it: PLD's ε costs far more per z than RDP's, most at small z.

    Raises:
        CalibrationError: z = ``Z_MIN`` already meets the target (it asks for next to no privacy).
    """
    if math.isinf(target_epsilon):
        return 0.0
    dp = library()
    mc = dp.mechanism_calibration
    # ε falls as z grows: when ε(Z_MIN) is already below the target no z brackets it, and the library would search
    # 30 doublings of z (each an accountant call, slowest at large z) before saying so. RDP's ε bounds PLD's from
    # above (and PLD's is slow at small z), so RDP's answers for both, as the PLD branch's RDP calibration did
    if epsilon(q, Z_MIN, rounds, delta, "rdp") < target_epsilon:
        raise _calibration_error(q, rounds, target_epsilon, delta)
    if accountant == "pld":
        hi = calibrate(q, rounds, target_epsilon, delta, "rdp")
        lo = hi
        while lo > Z_MIN and epsilon(q, lo, rounds, delta, "pld") <= target_epsilon:
            hi, lo = lo, max(Z_MIN, 0.8 * lo)
        while epsilon(q, hi, rounds, delta, "pld") > target_epsilon:  # not expected: PLD's ε is the tighter
            lo, hi = hi, 1.25 * hi
        bracket = mc.ExplicitBracketInterval(lo, hi)
    else:
        bracket = mc.LowerEndpointAndGuess(Z_MIN, 1.0)
    try:
        with _quiet():
            z = dp.calibrate_dp_mechanism(lambda: _accountant(accountant), lambda z: _rounds_event(q, z, rounds),
                                          target_epsilon, delta, bracket, tol=Z_TOL)
    except (mc.NoBracketIntervalFoundError, ValueError):  # ε(Z_MIN) ≤ target: no bracket of a root
        raise _calibration_error(q, rounds, target_epsilon, delta) from None
    return float(z)


def _calibration_error(q: float, rounds: int, target_epsilon: float, delta: float) -> CalibrationError:
    return CalibrationError(f"privacy.target_epsilon = {target_epsilon:g}: met with noise multiplier z < {Z_MIN} "
                            f"over {rounds} rounds at q = {q:.4g}, δ = {delta:.3g}: expected a smaller target, or "
                            "set privacy.noise_multiplier directly")


@dataclass(frozen=True)
class Budget:
    """What a run's ε depends on, besides the rounds done.

    Attributes:
        q: S/N, the rate at which a client is sampled each round (accounted as Poisson sampling).
        noise_multiplier: z.
        delta: δ.
        accountant: "rdp" or "pld".
        clip: C (not in ε; reported beside it); C_0 with adaptive clipping.
        adaptive: adaptive clipping's settings, reported beside ε (None: a fixed clip): C_0, γ, η_C, σ_b and the
            update's noise multiplier z_Δ; the round's two releases compose to z, which ε is of
            (``fedsl.algorithms.privacy``).
    """

    q: float
    noise_multiplier: float
    delta: float
    accountant: str
    clip: float
    adaptive: dict[str, float] | None = None

    def epsilon(self, rounds: int) -> float:
        """ε after ``rounds`` rounds at δ (cached: a row of metrics.csv costs one accountant call once)."""
        return epsilon(self.q, self.noise_multiplier, rounds, self.delta, self.accountant)

    def record(self, rounds: int) -> dict[str, Any]:
        """summary.json's ``privacy``: ε after ``rounds`` rounds with δ, z, C, q and the accountant (and adaptive
        clipping's settings)."""
        out = {"epsilon": self.epsilon(rounds), "delta": self.delta, "noise_multiplier": self.noise_multiplier,
               "clip": self.clip, "sampling_rate": self.q, "accountant": self.accountant, "rounds": rounds,
               "sampling": "accounted as Poisson sampling at rate q = S/N (fedsl samples exactly S)",
               "neighbouring": "add or remove one client"}
        if self.adaptive is not None:
            out["adaptive_clipping"] = dict(self.adaptive)
        return out
