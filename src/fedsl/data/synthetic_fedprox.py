"""Synthetic(α, β): the cross-device benchmark of Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated
Optimization in Heterogeneous Networks" (FedProx, MLSys 2020, Section 5.1; after Shamir, Srebro & Zhang 2014),
generated offline for any N, each client's samples made on demand from (seed, client id).

Client (device) k, as the authors' generator (``data/synthetic_1_1/generate_synthetic.py`` of their code):

    u_k ~ N(0, α²),  B_k ~ N(0, β²)                       (their code draws with scale α and β: standard
                                                            deviations; the paper writes N(0, α), N(0, β))
    W_k ∈ R^{60×10}, b_k ∈ R^10:  entries ~ N(u_k, 1)      (the label model; W_k x + b_k are the logits)
    v_k ∈ R^60:  entries ~ N(B_k, 1)                        (the mean of the inputs)
    x ~ N(v_k, Σ),  Σ = diag(j^-1.2), j = 1..60
    y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)

β controls how much the clients' inputs differ. α is meant to control how much their label models do, but u_k adds
the same amount to every class's weights and bias, so it never changes the argmax: α changes no label (in the
authors' generator as here). The label maps differ through W_k's and b_k's own unit noise, independent per client,
so a global model beats chance only on clients whose samples it has seen. Synthetic(0, 0) still gives every client
its own W_k, b_k (FedProx's Synthetic-IID, one shared model, is not built here).

Choices (each stated; the authors' where they made one):
- sizes: n_k = min(⌊lognormal(4, 2)⌋ + 50, ``data.synthetic_max_samples``) (their power law; their 30 devices
  needed no cap, but at N = 10^6 the largest of N draws is about 10^6 samples, so the cap is LEAF's: its synthetic
  generator caps sizes at 1,000); drawn once from (seed, ``SYNTHETIC_SIZES``), client k's size is the k-th draw,
  so client k is the same client for every N > k;
- train / test: ⌊0.9·n_k⌋ of a client's n_k samples are its training data and the rest its test data, their split;
  the training samples continue the client's stream after its model, the held-out ones come from a stream of their
  own (rng(seed, ``SYNTHETIC_TEST``, k)), so that a test set of many clients does not draw their training samples
  too (the samples are i.i.d. given the client, so either way is their split in law);
- the test set: the test parts of ``data.synthetic_test_clients`` clients drawn once from (seed,
  ``SYNTHETIC_TEST``), all N when N is not larger: then exactly their pooled per-device test set; above it, that
  of a uniform sample of the clients;
- the model: multinomial logistic regression, ``model.name = 'logreg'`` (their 'mclr'; their L2 term of 10^-3 is
  not applied);
- inputs are used as drawn (no standardisation: ``data.normalize`` is not read).

The server's D0 (``data.server_source``), drawn as the FSL paper's sources are:
- ``iid``: ``data.server_size`` = n0 fresh samples of the clients' mixture: each from the client owning a uniformly
  drawn position of the n = Σ n_k training samples (so client k with probability n_k / n, as an i.i.d. sample of the
  pool would be), drawn from that client's distribution (never one of its own samples: no overlap, whatever
  ``data.server_overlap`` says). Not class-balanced: the mixture's labels are not. **Shifted**: with
  ``data.synthetic_server_alpha`` = α0 and/or ``data.synthetic_server_beta`` = β0, the devices are seen through
  the prior (α0, β0): the same standard-normal draws, u_k = α0·z_k and B_k = β0·z'_k, so the shift grows with
  |β0 − β| (the inputs move; α0, like α, changes no label), and α0 = α, β0 = β is the unshifted D0 exactly;
- ``clients``: c = ``data.server_clients`` clients drawn once, s = ``data.server_samples_per_client`` of each
  one's training samples (the paper's Scenario 2: those clients keep them too), then ``data.server_size`` as a
  class-balanced size budget, as for every other dataset.

Scale: the clients' samples are never held. The federation keeps each client's training size (its offset: 8 bytes
a client), D0 and the test set; a round makes the S sampled clients' samples (``SyntheticClients.samples``: their
generators rebuilt from (seed, k), O(S·n_k·60) work), so N costs 8 bytes a client and nothing per round (building
the federation draws N sizes once, and makes the test set and D0: seconds, whatever N).
All of it is deterministic from the run's seed, offline.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedsl.core.rng import SYNTHETIC_CLIENT, SYNTHETIC_SIZES, rng
from fedsl.data import generated
from fedsl.data.clients import ClientIndex
from fedsl.data.federation import Federation
from fedsl.data.generated import train_sizes  # noqa: F401 (⌊0.9·n_k⌋, their split: part of this module's API)

FEATURES = 60  # dimension of x
CLASSES = 10  # labels
SIZE_MU, SIZE_SIGMA, SIZE_MIN = 4.0, 2.0, 50  # n_k = ⌊lognormal(μ = 4, σ = 2)⌋ + 50 (their power law)
SIZE_MAX = 1000  # the default cap on n_k (LEAF's synthetic generator caps at 1,000)
TEST_CLIENTS = 1000  # clients whose test parts make the test set (default of data.synthetic_test_clients)
SIGMA_DIAG = np.arange(1, FEATURES + 1, dtype=np.float64) ** -1.2  # Σ_jj = j^-1.2
_SIGMA_SQRT = np.sqrt(SIGMA_DIAG)


@dataclass(frozen=True)
class Device:
    """Client k's distribution: x ~ N(v, diag(Σ)), y = argmax(x W + b)."""

    W: np.ndarray  # [60, 10]
    b: np.ndarray  # [10]
    v: np.ndarray  # [60]

    def label(self, x: np.ndarray) -> np.ndarray:
        """y = argmax softmax(W^T x + b) (the softmax is monotone: the argmax of the logits)."""
        return np.argmax(x @ self.W + self.b, axis=1).astype(np.int64)

    def draw(self, gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n samples (x [n, 60] float64, y [n] int64) from ``gen``."""
        x = self.v + gen.standard_normal((n, FEATURES)) * _SIGMA_SQRT
        return x, self.label(x)


def device(seed: int, k: int, alpha: float, beta: float) -> tuple[Device, np.random.Generator]:
    """Client k's ``Device`` under the prior (α, β), and its generator, positioned after the device's draws (its
    samples come next). The draws: z_u, z_B, then v's, W's and b's unit normals; u_k = α·z_u, B_k = β·z_B."""
    gen = rng(seed, SYNTHETIC_CLIENT, k)
    z_u, z_b = gen.standard_normal(2)
    u, big_b = alpha * z_u, beta * z_b
    v = big_b + gen.standard_normal(FEATURES)
    W = u + gen.standard_normal((FEATURES, CLASSES))
    b = u + gen.standard_normal(CLASSES)
    return Device(W, b, v), gen


def client_samples(seed: int, k: int, n: int, alpha: float, beta: float, held_out: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """n of client k's samples: its training data (n = ⌊0.9·n_k⌋: its stream after its model), or with ``held_out``
    its test data (n = n_k − ⌊0.9·n_k⌋: rng(seed, SYNTHETIC_TEST, k)). The first samples of a longer draw are the
    same: a stream is read in order."""
    return generated.samples(prior(seed, alpha, beta), seed, k, n, held_out)


def client_sizes(seed: int, num_clients: int, cap: int = SIZE_MAX) -> np.ndarray:
    """n_k of clients 0..N-1: min(⌊lognormal(4, 2)⌋ + 50, cap), int64."""
    draws = rng(seed, SYNTHETIC_SIZES).lognormal(SIZE_MU, SIZE_SIGMA, num_clients)
    return np.minimum(np.minimum(draws, 2.0**62).astype(np.int64) + SIZE_MIN, cap)


class SyntheticClients(generated.OnDemandClients):
    """Synthetic(α, β)'s clients, their samples made on demand (``generated.OnDemandClients``)."""

    def __init__(self, seed: int, alpha: float, beta: float, clients: ClientIndex) -> None:
        super().__init__(seed, prior(seed, alpha, beta), clients, FEATURES)


def prior(seed: int, alpha: float, beta: float) -> generated.DeviceOf:
    """k → client k's ``Device`` under the prior (α, β), and its generator (``generated.DeviceOf``)."""
    return functools.partial(device, seed, alpha=alpha, beta=beta)


def federation(d, seed: int) -> Federation:
    """The registry's federation of ``data.dataset = 'synthetic_fedprox'`` (``fedsl.data.registry``): N =
    ``data.num_clients`` clients of Synthetic(``synthetic_alpha``, ``synthetic_beta``), their samples made on demand;
    D0 and the test set made now (see the module docstring)."""
    alpha, beta = d.synthetic_alpha, d.synthetic_beta
    a0 = alpha if d.synthetic_server_alpha is None else d.synthetic_server_alpha
    b0 = beta if d.synthetic_server_beta is None else d.synthetic_server_beta
    return generated.federation(d, seed, client_sizes(seed, d.num_clients, d.synthetic_max_samples),
                                prior(seed, alpha, beta), prior(seed, a0, b0), FEATURES, CLASSES)


def check_config(d) -> str | None:
    """The registry's config check of ``data.dataset = 'synthetic_fedprox'``: what data config ``d`` asks that this
    generated benchmark cannot give (one line), or None."""
    if d.server_source != "iid" and (d.synthetic_server_alpha is not None or d.synthetic_server_beta is not None):
        return ("data.synthetic_server_alpha / synthetic_server_beta shift D0's prior: expected data.server_source = "
                f"'iid', not {d.server_source!r}")
    return generated.check_config(d, "synthetic_fedprox")
