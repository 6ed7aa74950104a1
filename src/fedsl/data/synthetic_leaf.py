"""LEAF's synthetic federated data: the cross-device benchmark of Caldas, Duddu, Wu, Li, Konečný, McMahan, Smith &
Talwalkar, "LEAF: A Benchmark for Federated Settings" (2018, Section 3; their ``data/synthetic`` generator, run as
its README says: 60 features, 5 classes, one cluster of models), generated offline for any N, each client's samples
made on demand from (seed, client id).

LEAF builds on Synthetic(α, β) of FedProx (``fedsl.data.synthetic_fedprox``) but gives the clients' label models a
structure they share: one matrix Q and a few cluster centres, drawn once for the whole federation; each client's
model is a small perturbation of its cluster's centre mapped through Q. A global model can therefore learn it, and
a server holding samples of the clients' mixture can help, which is what a server-data study at cross-device scale
needs (in Synthetic(α, β) every client labels with its own independent W_k, b_k).

Shared (drawn once from rng(``data.synthetic_model_seed``, ``SYNTHETIC_SHARED``): one benchmark instance for every
run seed, as LEAF's generated files are one; its default is LEAF's default seed, 931,231), with m = the number of
clusters:

    Q ∈ R^{(d+1)×K×m}, entries ~ N(0, 1)
    cluster j's centre μ_j ∈ R^m: entries ~ N(l_j, 1), l_j ~ N(0, 1)

Client (device) k (rng(seed, ``SYNTHETIC_CLIENT``, k), then its training samples):

    its cluster j ~ p (``data.synthetic_clusters``: LEAF's prob_clusters, default [1.0], their default)
    B_k ~ N(0, 1),  v_k ∈ R^60: entries ~ N(B_k, 1)             (the mean of its inputs)
    w_k = Q u_k ∈ R^{(d+1)×K},  u_k ~ N(μ_j, 0.1² I_m)           (its label model; row 0 the bias)
    x ~ N(v_k, Σ),  Σ = diag(i^-1.2), i = 1..60
    y = argmax_c ([1, x] w_k + ε)_c,  ε ∈ R^K: entries ~ N(0, 0.1²) fresh per sample

With one cluster (u_k a scalar near μ), every client labels with Q up to a scale and small noise, and the clients
differ through their inputs (B_k, v_k), so through their label mixes; with several clusters their label maps differ
too, by cluster.

Choices (each stated; LEAF's where it made one):
- the label is the argmax of the logits, as the paper describes it (softmax, then argmax). LEAF's code normalises
  its softmax over a task's samples rather than over the classes (Python's built-in ``sum`` of a 2-D array), which
  subtracts a per-task, per-class constant from the logits; not reproduced: it makes a sample's label depend on the
  other samples drawn with it, so D0's fresh samples and a held-out split would have no label of their own;
- the shared model has a seed of its own: with one cluster, u_k = μ + 0.1·z is a scalar, so whether the clients
  share a label map (|μ| ≫ 0.1) or half of them label with its reverse (|μ| ≲ 0.1: chance for any global model)
  is decided by one draw, μ ~ N(0, 2); drawn from the run's seed, the three seeds 0, 1, 2 gave μ = 0.013, −1.24,
  0.16 and a centrally trained logistic regression 0.28, 0.99, 0.78 on held-out clients. The default instance
  (LEAF's seed) has μ = −0.26 (about 0.5% of the clients reversed);
- sizes: n_k = min(⌊lognormal(3, 2)⌋ + 5, ``data.synthetic_max_samples``) (LEAF's: its minimum 5, cap 1,000),
  client k's the k-th draw of (seed, ``SYNTHETIC_SIZES``), so client k is the same client for every N > k;
- train / test: ⌊0.9·n_k⌋ of a client's samples train, the rest are its test data (LEAF's ``-t sample``, its
  default ``--tf 0.9``); the test set is the held-out samples of ``data.synthetic_test_clients`` clients, as for
  Synthetic(α, β) (``fedsl.data.generated``): a uniform sample of clients, mostly never sampled for training,
  which a model of the shared structure can classify;
- a sample's 60 + K standard normals are drawn together (x's, then ε's), so the first samples of a longer draw are
  the same;
- the model: multinomial logistic regression, ``model.name = 'logreg'`` (LEAF's reference model for it);
- inputs are used as drawn (no standardisation: ``data.normalize`` is not read).

D0 (``data.server_source``): ``iid``, fresh samples of the clients' mixture, or ``clients``, c clients' own samples
(``fedsl.data.generated``). Scale: 8 bytes a client; a round makes its S clients' samples, O(S·n_k·60) work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedsl.core.rng import SYNTHETIC_CLIENT, SYNTHETIC_SHARED, SYNTHETIC_SIZES, rng
from fedsl.data import generated
from fedsl.data.federation import Federation

FEATURES = 60  # d: LEAF's README runs its generator with -num-dim 60
CLASSES = 5  # K: -num-classes 5
CLUSTERS = (1.0,)  # LEAF's PROB_CLUSTERS: one cluster of models
MODEL_SEED = 931_231  # the shared model's default seed (data.synthetic_model_seed): LEAF's default -seed
SIZE_MU, SIZE_SIGMA, SIZE_MIN = 3.0, 2.0, 5  # n_k = ⌊lognormal(μ = 3, σ = 2)⌋ + 5 (LEAF's power law)
MODEL_NOISE = 0.1  # u_k's spread about its cluster's centre
LOGIT_NOISE = 0.1  # ε's per sample and class
SIGMA_DIAG = np.arange(1, FEATURES + 1, dtype=np.float64) ** -1.2  # Σ_ii = i^-1.2
_SIGMA_SQRT = np.sqrt(SIGMA_DIAG)


@dataclass(frozen=True)
class Device:
    """Client k's distribution: x ~ N(v, diag(Σ)), y = argmax(x W + b + ε)."""

    W: np.ndarray  # [60, K]: rows 1..d of w_k
    b: np.ndarray  # [K]: row 0 of w_k (LEAF's constant input 1)
    v: np.ndarray  # [60]
    cluster: int

    def draw(self, gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n samples (x [n, 60] float64, y [n] int64) from ``gen``: each sample's x and ε from one row of normals."""
        z = gen.standard_normal((n, FEATURES + CLASSES))
        x = self.v + z[:, :FEATURES] * _SIGMA_SQRT
        y = np.argmax(x @ self.W + self.b + LOGIT_NOISE * z[:, FEATURES:], axis=1).astype(np.int64)
        return x, y


@dataclass(frozen=True)
class Shared:
    """What every client's model is built from: Q [d+1, K, m] and the clusters' centres μ [m, m], with their
    probabilities p [m]."""

    Q: np.ndarray
    centres: np.ndarray
    p: np.ndarray


def shared(model_seed: int = MODEL_SEED, clusters: tuple[float, ...] = CLUSTERS) -> Shared:
    """Q and the centres from rng(model_seed, ``SYNTHETIC_SHARED``): Q's normals, then each centre's l_j and m
    normals."""
    m = len(clusters)
    gen = rng(model_seed, SYNTHETIC_SHARED)
    q = gen.standard_normal((FEATURES + 1, CLASSES, m))
    centres = np.stack([gen.standard_normal() + gen.standard_normal(m) for _ in range(m)])
    return Shared(q, centres, np.asarray(clusters, dtype=np.float64))


def device(seed: int, k: int, model: Shared) -> tuple[Device, np.random.Generator]:
    """Client k's ``Device`` and its generator, positioned after the device's draws (its samples come next). The
    draws: its cluster (one uniform), B_k, v_k's normals, u_k's."""
    gen = rng(seed, SYNTHETIC_CLIENT, k)
    j = int(gen.choice(len(model.p), p=model.p / model.p.sum()))
    v = gen.standard_normal() + gen.standard_normal(FEATURES)
    u = model.centres[j] + MODEL_NOISE * gen.standard_normal(len(model.p))
    w = model.Q @ u  # [d+1, K]
    return Device(w[1:], w[0], v, j), gen


def client_sizes(seed: int, num_clients: int, cap: int) -> np.ndarray:
    """n_k of clients 0..N-1: min(⌊lognormal(3, 2)⌋ + 5, cap), int64."""
    draws = rng(seed, SYNTHETIC_SIZES).lognormal(SIZE_MU, SIZE_SIGMA, num_clients)
    return np.minimum(np.minimum(draws, 2.0**62).astype(np.int64) + SIZE_MIN, cap)


def devices(seed: int, model_seed: int = MODEL_SEED, clusters: tuple[float, ...] = CLUSTERS) -> generated.DeviceOf:
    """k → client k's ``Device`` and its generator (``generated.DeviceOf``), the shared model drawn once."""
    return functools.partial(device, seed, model=shared(model_seed, clusters))


def federation(d, seed: int) -> Federation:
    """The registry's federation of ``data.dataset = 'synthetic_leaf'`` (``fedsl.data.registry``): N =
    ``data.num_clients`` clients, their samples made on demand; D0 and the test set made now."""
    of = devices(seed, d.synthetic_model_seed, tuple(d.synthetic_clusters or CLUSTERS))
    return generated.federation(d, seed, client_sizes(seed, d.num_clients, d.synthetic_max_samples), of, of,
                                FEATURES, CLASSES)


def check_config(d) -> str | None:
    """The registry's config check of ``data.dataset = 'synthetic_leaf'``: what data config ``d`` asks that this
    generated benchmark cannot give (one line), or None."""
    # Synthetic(α, β)'s keys (synthetic_alpha, synthetic_server_alpha, ...) are refused by the config's rule for
    # keys another dataset reads (registry.DatasetInfo.reads)
    return generated.check_config(d, "synthetic_leaf")
