"""A federation in memory: one pool of samples, clients and server as index arrays.

The clients' index arrays are one ``ClientIndex`` (``fedsl.data.clients``: one concatenated array and N + 1
offsets), not N Python arrays, so that N = 10^6 clients cost megabytes and no Python loop. A generated benchmark
(Synthetic(α, β), ``fedsl.data.synthetic_fedprox``) holds no client sample at all: its clients' samples are made
on demand, each round for the clients sampled (``on_demand``), and its pool holds D0 only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from fedsl.data.clients import ClientIndex


class OnDemand(Protocol):
    """Clients whose samples are made when they are needed, from (seed, client id) alone, never held."""

    def samples(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The training samples of clients ``ids``, client after client: features [Σ n_i, ...] float64 and
        labels [Σ n_i] int64; client i's n_i is ``Federation.clients.sizes_of([i])``."""
        ...


@dataclass
class Federation:
    """Data of a federated run.

    Attributes:
        x, y: the pool of training samples (clients' and server's), as tensors.
        clients: D_i, an index array into the pool per client (N of them), kept as one ``ClientIndex`` (a list of
            arrays given here is converted); implicit (sizes only) when ``on_demand`` makes the samples.
        server: D0, an index array into the pool (empty when the server has no data).
        x_test, y_test: the test set the global model is evaluated on.
        num_classes: number of labels.
        class_names: one name per label.
        input_stats: (mean, std) per channel on the [0, 1] scale that standardised every
            input (``data.normalize = 'standardize'``); None when pixels are only / 255.
        unlabelled: U, the server's unlabelled data (FedDF's distillation set), an index array into the pool
            whose labels are never read: D0's own indices, or another source's images appended to the pool
            (``data.unlabelled``); empty when the server has none.
        on_demand: makes the clients' samples when they are sampled (a generated benchmark; its pool ``x``, ``y``
            then holds D0 only); None: the clients' samples are in the pool.
        validation: the validation set, an index array into the pool (int64): ⌊f·n_i⌋ of each client's samples
            set aside by ``data.validation`` = f (``fedsl.data.datasets.hold_out_validation``), in no client's D_i,
            not in D0 or U, never trained on; evaluated beside the test set so that a study (hyper-parameter
            tuning) can choose without reading the test set. Empty when there is none (the default).
    """

    x: torch.Tensor
    y: torch.Tensor
    clients: ClientIndex
    server: np.ndarray
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    class_names: list[str]
    input_stats: tuple[list[float], list[float]] | None = None
    unlabelled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    on_demand: OnDemand | None = None
    validation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        self.clients = ClientIndex.from_arrays(self.clients)

    @property
    def num_clients(self) -> int:
        """N."""
        return len(self.clients)

    @property
    def n(self) -> int:
        """n = Σ n_i, the clients' samples."""
        return self.clients.total

    @property
    def n0(self) -> int:
        """n0 = |D0|."""
        return len(self.server)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def to(self, device: torch.device, dtype: torch.dtype) -> "Federation":
        """On ``device``, inputs in ``dtype``; text (character indices, an integer dtype) keeps its dtype."""
        cast = dtype if self.x.is_floating_point() else None
        return Federation(self.x.to(device=device, dtype=cast), self.y.to(device), self.clients, self.server,
                          self.x_test.to(device=device, dtype=cast), self.y_test.to(device),
                          self.num_classes, self.class_names, self.input_stats, self.unlabelled, self.on_demand,
                          self.validation)

    def server_histogram(self) -> list[int]:
        return np.bincount(self.y[torch.from_numpy(self.server)].cpu().numpy(), minlength=self.num_classes).tolist() \
            if self.n0 else [0] * self.num_classes
