"""The benchmark workloads: the paper's Scenario 1 and 2 shapes, and Shakespeare's, on random data.

Speed does not depend on the pixel values, so every workload draws its images and
labels at random (a seeded ``torch.Generator``): no dataset files are needed and every
peer sees exactly the same tensors. A text model's (``TEXT_MODELS``: the char-LSTMs) inputs are
windows of character indices instead, ``uint8`` [n, 80] as fedsl's Shakespeare data holds them.
A workload fixes the model, N, n_i, S, B, the local epochs (so K = E·⌈n_i/B⌉ steps per
client per round), the test-set size, and whether the global model is evaluated on the test set
after every round (the paper's protocol).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

# model name -> (input shape: (C, H, W) of an image, (L,) characters of a text window; classes)
MODEL_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "cifar_cnn": ((3, 32, 32), 10),
    "emnist_cnn": ((1, 28, 28), 45),
    "small_cnn": ((1, 12, 12), 4),
    "mlp": ((1, 6, 6), 4),
    "char_lstm": ((80,), 80),  # windows of L = 80 characters -> the next of V = 80
    "char_lstm_small": ((80,), 80),
}
# models whose inputs are character indices < VOCAB (uint8), not images in [0, 1)
TEXT_MODELS = frozenset({"char_lstm", "char_lstm_small"})
VOCAB = 80
# models whose rounds take many seconds on a small CPU whatever their sample count (``is_heavy``)
HEAVY_MODELS = frozenset({"char_lstm"})


def random_inputs(model: str, n: int, generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` random inputs of ``model``: images ``torch.rand`` [n, C, H, W] (float32), or for a text model
    (``TEXT_MODELS``) character indices ``torch.randint(0, VOCAB)`` [n, L] in ``uint8``."""
    shape = MODEL_SHAPES[model][0]
    if model in TEXT_MODELS:
        return torch.randint(0, VOCAB, (n, *shape), dtype=torch.uint8, generator=generator, device=device)
    return torch.rand(n, *shape, generator=generator, device=device)


@dataclass(frozen=True)
class Workload:
    """One benchmark case.

    Attributes:
        name: row label, e.g. ``s2-cifar10+eval``.
        model: a ``fedsl.models`` name (input shape and classes from ``MODEL_SHAPES``).
        num_clients: N.
        samples_per_client: n_i (every client holds the same number).
        clients_per_round: S.
        batch_size: B.
        epochs: local epochs E (K = E·⌈n_i/B⌉).
        test_size: images in the test set.
        evaluate: evaluate the global model on the whole test set after every round.
        lr: local step size η_l (does not change the speed).
        seeds: > 1 runs that many independent seeds side by side (a seed sweep).
        train: False for an evaluation-only case (no training, one evaluation per "round").
        server_samples: n0 > 0 makes the round FSL's: after the clients' mean the server takes
            K0 = E_s·⌈n0/B⌉ SGD steps of batch B on its own n0 samples (0: FedAvg).
        server_epochs: E_s.
    """

    name: str
    model: str
    num_clients: int
    samples_per_client: int
    clients_per_round: int
    batch_size: int
    epochs: int = 1
    test_size: int = 10_000
    evaluate: bool = False
    lr: float = 0.01
    seeds: int = 1
    train: bool = True
    server_samples: int = 0
    server_epochs: int = 1

    @property
    def steps(self) -> int:
        """K, local steps of each client per round."""
        return self.epochs * math.ceil(self.samples_per_client / self.batch_size)

    @property
    def server_steps(self) -> int:
        """K0, the server's steps per round (0 without server data)."""
        return self.server_epochs * math.ceil(self.server_samples / self.batch_size)

    @property
    def train_samples_per_round(self) -> int:
        """Samples passed forward and backward per round (all seeds): S·K·B, plus K0·B on the server (last
        batches may be smaller)."""
        per_round = self.clients_per_round * self.epochs * self.samples_per_client
        per_round += self.server_epochs * self.server_samples
        return self.seeds * per_round if self.train else 0

    @property
    def eval_samples_per_round(self) -> int:
        return self.seeds * self.test_size if self.evaluate else 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        return MODEL_SHAPES[self.model][0]

    @property
    def num_classes(self) -> int:
        return MODEL_SHAPES[self.model][1]

    def describe(self) -> str:
        if not self.train:
            return f"{self.model}, evaluate {self.test_size} test images"
        s = (f"{self.model}, N={self.num_clients}, n_i={self.samples_per_client}, S={self.clients_per_round}, "
             f"B={self.batch_size}, K={self.steps}, test={self.test_size if self.evaluate else 0}")
        if self.server_samples:
            s += f", FSL: n0={self.server_samples}, K0={self.server_steps}"
        return s + (f", {self.seeds} seeds" if self.seeds > 1 else "")


def _base() -> dict[str, Workload]:
    # The fedsl presets scenario{1,2}-{cifar10,emnist}.toml; EMNIST's test set is the paper's
    # 45 Balanced classes x 400 = 18,000 images.
    # Shakespeare: the preset shakespeare.toml's FedAvg round (S = 10 roles, K = 20 steps of B = 10 windows, a
    # 10,000-window test set) on N = 100 clients of n_i = 200 windows (E = 1: K = 20), with its model
    # char_lstm_small (2 x 64) and with LEAF's char_lstm (2 x 256).
    return {
        "s1-cifar10": Workload("s1-cifar10", "cifar_cnn", 10, 5000, 4, 50),
        "s2-cifar10": Workload("s2-cifar10", "cifar_cnn", 1000, 50, 10, 10),
        # FSL on Scenario 2 (preset scenario2-cifar10's FSL: n0 = 500, E_s = 1, B0 = B: K0 = 50 server steps)
        "s2-cifar10-fsl": Workload("s2-cifar10-fsl", "cifar_cnn", 1000, 50, 10, 10, server_samples=500),
        "s1-emnist": Workload("s1-emnist", "emnist_cnn", 45, 2400, 5, 50, test_size=18_000),
        "s2-emnist": Workload("s2-emnist", "emnist_cnn", 450, 240, 5, 50, test_size=18_000),
        "shakespeare-small": Workload("shakespeare-small", "char_lstm_small", 100, 200, 10, 10),
        "shakespeare": Workload("shakespeare", "char_lstm", 100, 200, 10, 10),
    }


def workloads(smoke: bool = False) -> dict[str, Workload]:
    """All workloads by name: each base case with (``+eval``) and without evaluation every
    round, ``eval-cifar10`` / ``eval-emnist`` (evaluation only), and ``s2-cifar10-8seeds+eval`` (a sweep of
    8 seeds, evaluated every round).

    ``shakespeare-small`` and ``shakespeare`` (char-LSTMs, with and without ``+eval``) are not in
    ``DEFAULT_WORKLOADS``: ask for them by name.

    ``smoke``: the same names on a tiny model and data (CI checks the harness, not speed); a text workload
    stays text (``char_lstm_small`` on a few uint8 windows), so that the smoke runs the integer-input path.
    """
    out: dict[str, Workload] = {}
    for name, w in _base().items():
        if smoke:
            w = replace(w, model="char_lstm_small" if w.model in TEXT_MODELS else "small_cnn",
                        num_clients=min(w.num_clients, 6), samples_per_client=12,
                        clients_per_round=min(w.clients_per_round, 3), batch_size=4, test_size=40,
                        server_samples=min(w.server_samples, 8))
        out[name] = w
        out[name + "+eval"] = replace(w, name=name + "+eval", evaluate=True)
    s2 = out["s2-cifar10+eval"]
    out["s2-cifar10-8seeds+eval"] = replace(s2, name="s2-cifar10-8seeds+eval", seeds=2 if smoke else 8)
    for name in ("s2-cifar10", "s2-emnist"):
        ev = "eval-" + name.split("-")[1]
        out[ev] = replace(out[name], name=ev, evaluate=True, train=False)
    return out


def is_heavy(w: Workload) -> bool:
    """Rounds of many seconds on a small CPU: > 5,000 training samples per round, several seeds, or a heavy
    model (``HEAVY_MODELS``: LEAF's char-LSTM, ~0.4 GFLOP per training window)."""
    return w.train_samples_per_round > 5000 or w.seeds > 1 or (w.model in HEAVY_MODELS and w.train)


def timed_rounds(w: Workload, rounds: int) -> int:
    """Rounds timed per repetition: ``rounds``, or 1 for heavy rounds (``is_heavy``)."""
    return 1 if is_heavy(w) else rounds


DEFAULT_WORKLOADS = ["s2-cifar10+eval", "s2-cifar10", "s2-cifar10-fsl", "eval-cifar10", "s1-cifar10+eval", "s1-cifar10",
                     "s2-emnist+eval", "s2-emnist", "eval-emnist", "s1-emnist+eval", "s1-emnist",
                     "s2-cifar10-8seeds+eval"]


@dataclass
class Data:
    """Random data of a workload: a pool of training images, the clients' index arrays
    (client i holds ``clients[i]``), and a test set."""

    x: torch.Tensor
    y: torch.Tensor
    clients: list[np.ndarray]
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_server: torch.Tensor | None = None  # the server's n0 samples (FSL workloads)
    y_server: torch.Tensor | None = None


def server_tensors(w: Workload, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's n0 random images and labels (FSL workloads), a function of (workload, seed) alone."""
    g = torch.Generator().manual_seed(104_729 * seed + 99_991)
    x = random_inputs(w.model, w.server_samples, g)
    y = torch.randint(0, w.num_classes, (w.server_samples,), generator=g)
    return x, y


def client_tensors(w: Workload, cid: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s random images (or text windows) and labels, a function of (workload, seed, cid) alone.

    This is how each peer gets the same client data without sharing memory: the Flower
    ClientApp (another process) regenerates it from its partition id.
    """
    g = torch.Generator().manual_seed(1_000_003 * seed + cid + 1)
    x = random_inputs(w.model, w.samples_per_client, g)
    y = torch.randint(0, w.num_classes, (w.samples_per_client,), generator=g)
    return x, y


def test_tensors(w: Workload, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7_919 * seed + 12_345)
    x = random_inputs(w.model, w.test_size, g)
    y = torch.randint(0, w.num_classes, (w.test_size,), generator=g)
    return x, y


def make_data(w: Workload, seed: int = 0, clients: list[int] | None = None) -> Data:
    """The pool of all N clients' data (or only of ``clients``, the rest empty) and the test set.

    Generating 50,000 CIFAR-sized images takes about a second; only clients that a
    benchmark samples need data, so ``clients`` limits generation to those.
    """
    ids = list(range(w.num_clients)) if clients is None else sorted(set(clients))
    xs, ys, index = [], [], [np.zeros(0, dtype=np.int64) for _ in range(w.num_clients)]
    start = 0
    for cid in ids:
        x, y = client_tensors(w, cid, seed)
        xs.append(x)
        ys.append(y)
        index[cid] = np.arange(start, start + len(x))
        start += len(x)
    xt, yt = test_tensors(w, seed)
    xs0, ys0 = server_tensors(w, seed) if w.server_samples else (None, None)
    return Data(torch.cat(xs), torch.cat(ys), index, xt, yt, xs0, ys0)
