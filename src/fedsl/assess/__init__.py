"""Assess candidate server datasets D0 before training (``fedsl data assess``).

For each candidate D0 (the run's config with some ``data.server_*`` keys changed), at the
shared starting point x (x_0, or x_R after R FedAvg rounds, which do not read D0):

    ξ² = ‖∇f0 − ∇F‖², G² = (1/N) Σ_i ‖∇f_i − ∇F‖², cos(∇F, ∇f0)     as ``fedsl.engine.diagnostics.measure``
    the paper's condition (Section 3, Eq. grad_f0_cond_angle) for one server step to improve F:
        2⟨∇F, ∇f0⟩ > L·η·‖∇f0‖²,   η = γ·η0, the run's resolved server learning rate
    the predicted one-step change (descent lemma, Eq. ineq1):
        ΔF_pred = η⟨∇F, ∇f0⟩ − L·η²·‖∇f0‖²/2    (> 0 ⇔ the condition holds)
    normalised by ‖∇F‖²/(2L), the decrease the descent lemma guarantees for the best step along
    −∇F itself (so 1 = as good as a full-gradient step on the clients' data), and the measured
    one-step change F(x) − F(x − η∇f0) (exact, a forward pass over the clients' data).
    Candidates are ranked per round: K0 times the normalised one-step prediction (see ``rank``).

L is estimated as the spectral norm of ∇²F(x): power iteration with Hessian-vector products
(forward-over-reverse autodiff, exact, no finite differences) on a uniform subsample of the
clients' samples (``hessian_samples``; all of them when fewer). Why this and not a secant
along the server step: L is a property of F alone, so it is computed once for all candidates
that share the clients, and it is the quantity the paper's condition names (∇F's Lipschitz
constant, here its local value at x, a lower bound of the global one).

Cost: in the simulator ∇F is exact because it reads every client's data. In a deployment it
would take one extra round in which every client (or a sample of them, for an estimate) sends
its full-batch gradient ∇f_i(x) (and, for L, a few Hessian-vector products), with the privacy
cost of sharing gradients (they reveal data; secure aggregation would reveal only the sum,
which is all ∇F and the Hessian-vector products need, but G² needs each client's gradient).

It builds the run a config describes and measures at its starting point: it may import ``runs``, ``config`` and
everything below them; only the command line imports it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.func import grad, jvp

from fedsl.config.loading import apply_overrides
from fedsl.config.own_keys import SERVER_KEYS as OWN_SERVER
from fedsl.config.schema import ROUNDS_MAX, ConfigError, RunConfig, validate
from fedsl.core.errors import DataError
from fedsl.core.types import Params
from fedsl.data.federation import Federation
from fedsl.data.registry import DATASETS
from fedsl.engine.diagnostics import client_gradients_sum
from fedsl.engine.functional import FunctionalModel, full_gradient

# The keys a candidate may change: D0 and the server step's own settings. Anything else (the
# clients, the model, the seed) would change F or x_0 and make the candidates incomparable.
SERVER_KEYS = ("server.gamma", "server.lr", "server.batch_size", "server.epochs", "server.steps")
HESSIAN_SAMPLES = 4096
POWER_ITERS = 30
POWER_TOL = 1e-3
ASSESS_STREAM = 28_004  # numpy seed stream of the Hessian subsample (independent of the run's streams)
FILES = ("assess.json", "assess.csv")


def _dot(a: Params, b: Params) -> torch.Tensor:
    return sum((a[n] * b[n]).sum() for n in a)

LIKELY, UNCLEAR, UNLIKELY = "likely to help", "unclear", "unlikely to help"
# The paper's one-step condition fails but the angle is acute. In the validation (REPRODUCTION.md, "judging a D0
# before training") two such D0s on CIFAR-10 still gained over FedAvg, less than every D0 whose condition held,
# and one on EMNIST hurt (0.26 below FedAvg; its second seed diverged): the step may be too long either way.
LESS = "may help less, or hurt"


@dataclass
class Candidate:
    """A candidate D0: a name and its ``key=value`` overrides of the run's config."""
    name: str
    overrides: list[str]


@dataclass
class Assessment:
    name: str
    overrides: list[str]
    n0: int
    server_histogram: list[int]
    xi2: float  # ξ² = ‖∇f0 − ∇F‖²
    G2: float  # G²
    cos_F_f0: float  # cos(∇F, ∇f0)
    dot_F_f0: float  # ⟨∇F, ∇f0⟩
    gradF_norm2: float  # ‖∇F‖²
    gradf0_norm2: float  # ‖∇f0‖²
    L: float  # estimate of ∇F's Lipschitz constant at x (spectral norm of ∇²F)
    server_lr: float  # η = γ·η0
    condition: bool  # 2⟨∇F, ∇f0⟩ > L·η·‖∇f0‖²
    condition_margin: float  # 2⟨∇F, ∇f0⟩ − L·η·‖∇f0‖²
    predicted_gain: float  # η⟨∇F, ∇f0⟩ − L·η²·‖∇f0‖²/2
    predicted_gain_rel: float  # predicted_gain / (‖∇F‖²/(2L))
    measured_gain: float  # F(x) − F(x − η∇f0)
    measured_gain_rel: float  # measured_gain / (‖∇F‖²/(2L))
    F: float  # F(x)
    server_steps: int  # K0, the server's steps per round
    round_gain_rel: float  # K0 · predicted_gain_rel: a round's K0 steps, first-order (∇f0, ∇F held at x)
    verdict: str
    reason: str
    rank: int = 0
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- candidates

def split_overrides(text: str) -> list[str]:
    """``a=1,b=[1,2],c='x,y'`` -> ['a=1', 'b=[1,2]', "c='x,y'"]: commas split outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def check_key(key: str, where: str) -> None:
    if not (key.startswith("data.server_") or key in SERVER_KEYS):
        raise ConfigError(f"{where}: key {key!r} is not a server-data key: expected data.server_* "
                          f"(e.g. data.server_size) or one of {', '.join(SERVER_KEYS)}")


def parse_candidate(spec: str) -> Candidate:
    """``NAME:key=value,key=value`` (``--candidate``) -> Candidate; a bad spec is a one-line ConfigError."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not name or not rest.strip():
        raise ConfigError(f"--candidate {spec!r}: expected NAME:key=value[,key=value...], "
                          "e.g. 'iid500:data.server_size=500'")
    over = split_overrides(rest)
    for item in over:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ConfigError(f"--candidate {spec!r}: {item!r} is not key=value, e.g. data.server_size=500")
        check_key(key.strip(), f"--candidate {spec!r}")
    return Candidate(name, over)


def _flatten(prefix: str, value) -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flatten(f"{prefix}.{k}" if prefix else k, v)]
    return [(prefix, value)]


def _toml_value(v) -> str:
    return json.dumps(v)  # numbers, booleans, strings and lists read back the same as TOML values


def candidates_from_variants(cfg: RunConfig) -> tuple[list[Candidate], list[str]]:
    """The config's variants that change only server-data keys, as candidates; and the names of the others."""
    found, skipped = [], []
    for name, over in cfg.variants.items():
        items = _flatten("", over) if isinstance(over, dict) else []
        if items and all(k.startswith("data.server_") or k in SERVER_KEYS for k, _ in items):
            found.append(Candidate(name, [f"{k}={_toml_value(v)}" for k, v in items]))
        else:
            skipped.append(name)
    return found, skipped


def candidate_config(base: RunConfig, cand: Candidate) -> RunConfig:
    """The run's config with the candidate's overrides (one run: no variants, sweeps or seeds)."""
    data = base.model_dump(exclude={"variants", "seeds", "sweep", "paper", "paper_claims", "claims", "paper_rounds",
                                    "plot", "quick"})
    data["seed"] = base.seeds[0] if base.seeds else base.seed
    try:
        cfg = validate(apply_overrides(data, cand.overrides))
    except ConfigError as e:
        raise ConfigError(f"candidate {cand.name!r}: {e}") from None
    return cfg


# ---------------------------------------------------------------------------------------------- measurements

def _dtype(params: Params) -> torch.dtype:
    """The model's float dtype (the inputs' may be text's character indices)."""
    return next(iter(params.values())).dtype


def _chunks(n: int, size: int):
    return ((i, min(i + size, n)) for i in range(0, n, size))


def mean_loss(fm: FunctionalModel, params: Params, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """The mean loss over (x, y), dropout off."""
    fm.train(False)
    total = 0.0
    with torch.no_grad():
        for a, b in _chunks(len(x), batch_size):
            w = torch.full((b - a,), 1.0 / len(x), dtype=_dtype(params), device=x.device)
            total += float(fm.loss(params, x[a:b], y[a:b], w, None))
    return total


def hessian_vector(fm: FunctionalModel, params: Params, x: torch.Tensor, y: torch.Tensor, v: Params,
                   batch_size: int = 500) -> Params:
    """∇²f(params)·v of the mean loss f over (x, y): forward-over-reverse autodiff (exact), dropout off."""
    fm.train(False)
    out = {k: torch.zeros_like(p) for k, p in params.items()}
    for a, b in _chunks(len(x), batch_size):
        w = torch.full((b - a,), 1.0 / len(x), dtype=_dtype(params), device=x.device)
        g = grad(fm.loss)
        _, hv = jvp(lambda p: g(p, x[a:b], y[a:b], w, None), (params,), (v,))  # noqa: B023 (called right here)
        for k in out:
            out[k] += hv[k]
    return out


def hessian_norm(fm: FunctionalModel, params: Params, x: torch.Tensor, y: torch.Tensor, iters: int = POWER_ITERS,
                 tol: float = POWER_TOL, seed: int = 0) -> tuple[float, int]:
    """L ≈ ‖∇²f(params)‖₂ (the largest |eigenvalue|) of the mean loss over (x, y) by power iteration;
    stops when the estimate changes by less than ``tol`` (relative). Returns (estimate, iterations)."""
    g = torch.Generator().manual_seed(seed)
    v = {k: torch.randn(p.shape, generator=g, dtype=torch.float64).to(p) for k, p in params.items()}
    norm = math.sqrt(float(_dot(v, v)))
    v = {k: t / norm for k, t in v.items()}
    est = 0.0
    for it in range(1, iters + 1):
        hv = hessian_vector(fm, params, x, y, v)
        new = math.sqrt(float(_dot(hv, hv)))  # ‖Hv‖ with ‖v‖ = 1 -> |λ_max| as v aligns
        if new == 0.0:
            return 0.0, it
        v = {k: t / new for k, t in hv.items()}
        if it > 1 and abs(new - est) <= tol * new:
            return new, it
        est = new
    return est, iters


@dataclass
class ClientSide:
    """What every candidate on the same clients shares at x: ∇F, G², F(x), L."""
    gF: Params
    G2: float
    F: float
    L: float
    power_iters: int
    hessian_samples: int


def client_side(fm: FunctionalModel, x: Params, fed: Federation, hessian_samples: int = HESSIAN_SAMPLES,
                power_iters: int = POWER_ITERS, power_tol: float = POWER_TOL, seed: int = 0) -> ClientSide:
    """∇F and G² exactly as ``diagnostics.measure`` (vmapped clients), F(x), and L on a subsample."""
    N = fed.num_clients
    total, gF, sq = client_gradients_sum(fm, x, fed, fed.clients)
    mean = {k: v / N for k, v in total.items()}
    G2 = max(float(sq / N - 2 * _dot(mean, gF) + _dot(gF, gF)), 0.0)
    # F = Σ_i (n_i/n) f_i is the mean loss over the clients' samples (one weight 1/n each)
    union = fed.clients.indices
    idx = torch.as_tensor(union, device=fed.x.device)
    F = mean_loss(fm, x, fed.x[idx], fed.y[idx])
    if hessian_samples and hessian_samples < len(union):
        pick = np.sort(np.random.default_rng([seed, ASSESS_STREAM]).choice(len(union), hessian_samples, replace=False))
        idx = torch.as_tensor(union[pick], device=fed.x.device)
    L, iters = hessian_norm(fm, x, fed.x[idx], fed.y[idx], power_iters, power_tol, seed)
    return ClientSide(gF, G2, F, L, iters, len(idx))


def judge(a: Assessment) -> tuple[str, str]:
    """The verdict on one candidate and its reason."""
    if not math.isfinite(a.cos_F_f0) or a.cos_F_f0 <= 0:
        return UNLIKELY, f"angle ≥ 90°: cos(∇F, ∇f0) = {a.cos_F_f0:.3f}, −∇f0 is not a descent direction of F"
    if not a.condition:
        return LESS, (f"condition fails: 2⟨∇F,∇f0⟩ = {2 * a.dot_F_f0:.3g} ≤ L·γη0·‖∇f0‖² = "
                      f"{a.L * a.server_lr * a.gradf0_norm2:.3g}: one full server step may overshoot (worst-case L); "
                      "in the validation such D0s helped less than those whose condition holds, or hurt")
    if a.xi2 > a.G2:
        return UNCLEAR, (f"one step helps (predicted {a.predicted_gain_rel:.2f} of a full step on F, "
                         f"{a.round_gain_rel:.2f} per round), but ξ² = "
                         f"{a.xi2:.3g} > G² = {a.G2:.3g}: D0's gradient is farther from ∇F than a mean client's")
    return LIKELY, (f"acute angle (cos {a.cos_F_f0:.2f}), condition holds, ξ² = {a.xi2:.3g} ≤ G² = {a.G2:.3g}; "
                    f"predicted {a.predicted_gain_rel:.2f} of a full step on F per step, {a.round_gain_rel:.2f} per "
                    f"round (K0 = {a.server_steps})")


def assess_server_data(fm: FunctionalModel, x: Params, fed: Federation, server_lr: float, side: ClientSide,
                       name: str = "D0", overrides: list[str] | None = None, server_steps: int = 1) -> Assessment:
    """One candidate D0 (``fed.server``) at x, with the clients' shared quantities ``side``; ``server_lr`` = γ·η0,
    ``server_steps`` = K0 (the run's steps per round, for the per-round prediction)."""
    if not fed.n0:
        raise ConfigError(f"candidate {name!r}: D0 is empty: expected data.server_size > 0 or "
                          "data.server_source = 'clients' / 'dataset' / 'other_ids'")
    idx = torch.as_tensor(fed.server, device=fed.x.device)
    g0 = full_gradient(fm, x, fed.x[idx], fed.y[idx])
    gF = side.gF
    diff = {k: g0[k] - gF[k] for k in x}
    xi2 = float(_dot(diff, diff))
    dot, nF, n0 = float(_dot(gF, g0)), float(_dot(gF, gF)), float(_dot(g0, g0))
    cos = dot / math.sqrt(nF * n0) if nF > 0 and n0 > 0 else float("nan")
    L, eta = side.L, server_lr
    margin = 2 * dot - L * eta * n0
    pred = eta * dot - L * eta ** 2 * n0 / 2
    best = nF / (2 * L) if L > 0 else float("nan")  # the descent lemma's decrease for the step 1/L along −∇F
    union = torch.as_tensor(fed.clients.indices, device=fed.x.device)
    stepped = {k: x[k] - eta * g0[k] for k in x}
    measured = side.F - mean_loss(fm, stepped, fed.x[union], fed.y[union])
    a = Assessment(name, list(overrides or []), fed.n0, fed.server_histogram(), xi2, side.G2, cos, dot, nF, n0, L,
                   eta, margin > 0, margin, pred, pred / best, measured, measured / best, side.F, server_steps,
                   server_steps * pred / best, "", "")
    a.verdict, a.reason = judge(a)
    return a


def rank(results: list[Assessment]) -> list[Assessment]:
    """Best first: by the predicted gain of a round's K0 server steps, K0·ΔF_pred/(‖∇F‖²/(2L)). Per round, not
    per step: the paper's defaults make a round's server movement K0·η0 the same for every n0 (η0 ∝ 1/K0),
    so one step of a small D0 is longer than one of a large D0, and per step the small D0 would look better."""
    key = [(-r.round_gain_rel if math.isfinite(r.round_gain_rel) else math.inf) for r in results]
    order = sorted(range(len(results)), key=lambda i: key[i])
    out = [results[i] for i in order]
    for i, r in enumerate(out, 1):
        r.rank = i
    return out


# ---------------------------------------------------------------------------------------------- driver

def _fingerprint(fed: Federation) -> str:
    h = hashlib.sha256()
    for c in fed.clients:
        h.update(np.asarray(c, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


def _server_step(hparams) -> tuple[float, int]:
    """(γ·η0, K0) as the runner resolved them."""
    found = {h.symbol: h.value for h in hparams}
    if "γ·η0" in found:
        return float(found["γ·η0"]), int(found["K0"])
    raise ConfigError("the config's algorithm takes no server step on D0: expected an algorithm with server "
                      "learning, e.g. algorithm.name = 'fsl' (the step size γ·η0 is the run's own)")


def assess(cfg: RunConfig, candidates: list[Candidate], warmup_rounds: int = 0,
           hessian_samples: int = HESSIAN_SAMPLES, power_iters: int = POWER_ITERS, power_tol: float = POWER_TOL,
           log: Callable[[str], None] = lambda s: None) -> list[Assessment]:
    """Assess each candidate D0 of ``cfg`` (its config with the candidate's overrides) at x_0, or at
    x_R after ``warmup_rounds`` = R rounds of FedAvg (clients only, so x_R is the same for every
    candidate on the same clients); returns the assessments ranked, best first.

    The server step size η = γ·η0 is each candidate's own, resolved as ``fedsl run`` resolves it
    (paper defaults: η0 = √S·η_l·K/K0, K0 = E_s·⌈n0/B0⌉, so it depends on n0).
    """
    from fedsl.config.resolve import resolve
    from fedsl.runs.build import prepare  # it imports heavy modules: on demand

    if not candidates:
        raise ConfigError("no candidates: give --candidate NAME:key=value[,...] or variants that set only "
                          "data.server_* keys")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ConfigError(f"candidate names {names}: expected distinct names")
    if DATASETS[cfg.data.dataset].federation is not None:
        raise ConfigError(f"data.dataset = {cfg.data.dataset!r} makes each client's samples on demand, and assess "
                          "takes every client's full-batch gradient: expected a dataset of files")
    if cfg.server.pretrain:
        raise ConfigError("server.pretrain = true: x_0 would then depend on each candidate's D0; assess compares "
                          "candidates at one x_0: expected server.pretrain = false")
    if not 0 <= warmup_rounds <= ROUNDS_MAX:
        raise ConfigError(f"--warmup-rounds {warmup_rounds}: expected 0 to {ROUNDS_MAX} FedAvg rounds")
    cfgs = [candidate_config(cfg, c) for c in candidates]
    sides: dict[str, tuple[Params, ClientSide]] = {}
    results = []
    for cand, ccfg in zip(candidates, cfgs):
        t0 = time.perf_counter()
        # FedAvg with the candidate's data: its x_0 is the run's, and its rounds do not read D0
        fedavg = ccfg.model_dump()
        fedavg["algorithm"] = {k: v for k, v in fedavg["algorithm"].items() if k in
                               ("clients_per_round", "local_lr", "batch_size", "local_epochs", "local_steps",
                                "global_lr", "weighted", "client_momentum", "weight_decay")}
        fedavg["algorithm"]["name"] = "fedavg"
        # without server learning's keys, which FedAvg does not read (a config refuses them)
        fedavg["server"] = {**{k: v for k, v in fedavg["server"].items() if k not in OWN_SERVER.readers},
                            "learning": "auto", "pretrain": False}
        try:
            prep = prepare(validate(fedavg))
            _, _, hparams = resolve(ccfg, prep.fed)
        except (ConfigError, DataError) as e:  # the same class (the CLI's one-line errors), naming the candidate
            raise type(e)(f"candidate {cand.name!r}: {e}") from None
        sim = prep.sim
        key = _fingerprint(prep.fed)
        if key not in sides:
            state = sim.initial_state(None)
            for t in range(warmup_rounds):
                state, _ = sim.round(state, t)
            x = sim.layout(state.x)
            sides[key] = (x, client_side(sim.fm, x, sim.fed, hessian_samples, power_iters, power_tol, ccfg.seed))
            log(f"clients' side at x_{warmup_rounds}: ‖∇F‖² = {float(_dot(sides[key][1].gF, sides[key][1].gF)):.4g}, "
                f"G² = {sides[key][1].G2:.4g}, L ≈ {sides[key][1].L:.4g} ({sides[key][1].power_iters} power "
                f"iterations on {sides[key][1].hessian_samples} samples)")
        x, side = sides[key]
        lr, k0 = _server_step(hparams)
        a = assess_server_data(sim.fm, x, sim.fed, lr, side, cand.name, cand.overrides, k0)
        a.extra = {"warmup_rounds": warmup_rounds, "power_iterations": side.power_iters,
                   "hessian_samples": side.hessian_samples, "clients": key[:12],
                   "wall_time": round(time.perf_counter() - t0, 3)}
        log(f"{cand.name}: n0 = {a.n0}, cos = {a.cos_F_f0:.3f}, ξ² = {a.xi2:.4g}, condition "
            f"{'holds' if a.condition else 'fails'} ({a.extra['wall_time']:.1f} s)")
        results.append(a)
    if len(sides) > 1:
        log(f"note: the candidates split the clients {len(sides)} ways (data.server_overlap = false changes the "
            "clients): their ∇F differ")
    return rank(results)


COLUMNS = ("rank", "name", "n0", "xi2", "G2", "cos_F_f0", "L", "server_lr", "condition", "condition_margin",
           "predicted_gain", "predicted_gain_rel", "server_steps", "round_gain_rel", "measured_gain",
           "measured_gain_rel", "verdict", "reason")


def write(results: list[Assessment], out: Path, meta: dict) -> tuple[Path, Path]:
    """assess.json (everything, with ``meta``) and assess.csv (one row per candidate) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    js, cs = out / FILES[0], out / FILES[1]
    js.write_text(json.dumps({**meta, "candidates": [asdict(r) for r in results]}, indent=2, ensure_ascii=False)
                  + "\n", encoding="utf-8")
    with open(cs, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in results:
            d = asdict(r)
            w.writerow([d[c] for c in COLUMNS])
    return js, cs
