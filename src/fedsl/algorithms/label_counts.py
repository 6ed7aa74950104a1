"""Class counts of the clients' data and of the server's D0: what a rule that reads non-IID degrees gets.

The engine counts them once, from the pool's labels and the index arrays of each client's D_i and of D0
(``server_round.ServerSide.label_counts``); FedDU (``feddu``) reads P_G, the label distribution of all
clients' data pooled, P'_t, that of the round's clients, and P_0, that of D0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedsl.data.clients import ClientIndex


@dataclass(frozen=True)
class LabelCounts:
    """Class counts the server reads: one row per client [N, L], and D0's [L]."""

    clients: np.ndarray
    server: np.ndarray

    @property
    def overall(self) -> np.ndarray:
        """All clients' data pooled: P_G's counts."""
        return self.clients.sum(0)

    def pooled(self, ids: Sequence[int]) -> np.ndarray:
        """The counts of clients ``ids``' data pooled (P'_t's)."""
        return self.clients[np.asarray(ids, dtype=np.int64)].sum(0)


def label_counts(y: torch.Tensor, clients: Sequence[np.ndarray], server: np.ndarray, num_classes: int
                 ) -> LabelCounts:
    """``LabelCounts`` from the labels ``y`` of the pool and the clients' and D0's index arrays (a ``ClientIndex``
    or a list of arrays): one ``bincount`` over every client's samples, no loop over the N clients."""
    labels = y.cpu().numpy()
    index = ClientIndex.from_arrays(clients)
    n = len(index)
    own = np.bincount(index.owners() * num_classes + labels[index.indices], minlength=n * num_classes)
    rows = own.reshape(n, num_classes)
    if index.shared is not None:  # DS: D0's counts in every client's row
        rows = rows + np.bincount(labels[index.shared], minlength=num_classes)
    return LabelCounts(rows.astype(np.float64), np.bincount(labels[server], minlength=num_classes).astype(np.float64))
