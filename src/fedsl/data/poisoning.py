"""Data poisoning of a federation: malicious clients that train on flipped labels (``attack.kind = 'label_flip'``).

The label-flipping attack (Tolpegin, Truex, Gursoy & Liu, "Data poisoning attacks against federated learning
systems", ESORICS 2020; a baseline attack of Fang, Cao, Jia & Gong, "Local model poisoning attacks to
Byzantine-robust federated learning", USENIX Security 2020): each malicious client relabels its own samples
y → L − 1 − y and otherwise trains honestly.

The pool of samples is shared: the server's D0 may hold the same samples (an iid D0 drawn from the whole
pool, or, with data sharing, D0 joined to every D_i), and other runs of a stack may share the pool tensor.
So nothing is relabelled in place: the malicious clients' samples are *copied* to the end of the pool with
flipped labels and their index arrays point at the copies. D0, the honest clients and the test set keep
their indices and labels; a malicious client's batches are the same samples in the same order as without
the attack (its plan permutes positions in its own index array), only their labels differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from fedsl.data.federation import Federation


def flipped(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y → L − 1 − y (L = ``num_classes``): every label moved, the class order reversed."""
    return num_classes - 1 - y


def flip_labels(fed: Federation, clients: Sequence[int]) -> Federation:
    """``fed`` with clients ``clients`` (ids i, each D_i) training on flipped labels (see the module docstring).

    The pool grows by Σ_{i∈M} n_i samples (copies); ``fed`` itself is unchanged. No client: ``fed`` itself.
    """
    ids = sorted({int(i) for i in clients})
    if not ids or not sum(len(fed.clients[i]) for i in ids):
        return fed
    take = np.concatenate([np.asarray(fed.clients[i], dtype=np.int64) for i in ids])
    at = torch.as_tensor(take, device=fed.x.device)
    x = torch.cat([fed.x, fed.x[at]])
    y = torch.cat([fed.y, flipped(fed.y[at], fed.num_classes)])
    out = list(fed.clients)
    start = len(fed.x)
    for i in ids:
        n = len(fed.clients[i])
        out[i] = np.arange(start, start + n, dtype=np.int64)
        start += n
    return replace(fed, x=x, y=y, clients=out)
