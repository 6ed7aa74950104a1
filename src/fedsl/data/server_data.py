"""Sources of the server's dataset D0."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedsl.core.rng import SERVER_DATA, rng
from fedsl.data.partition import PartitionError, class_label


def iid_per_class(labels: np.ndarray, size: int, seed: int, pool: np.ndarray | None = None,
                  class_names: Sequence[str] | None = None) -> np.ndarray:
    """n0 samples with ≈ n0/L per class (paper, Scenario 1), drawn without replacement from ``pool``.

    The first n0 mod L classes (in a seeded order) get one sample more. ``class_names``
    (label -> name) is for messages only.
    """
    labels = np.asarray(labels)
    pool = np.arange(len(labels)) if pool is None else np.asarray(pool, dtype=np.int64)
    classes = np.unique(labels[pool])
    gen = rng(seed, SERVER_DATA)
    order = classes[gen.permutation(len(classes))]
    base, extra = divmod(size, len(classes))
    picked = []
    for j, c in enumerate(order):
        k = base + (1 if j < extra else 0)
        members = pool[labels[pool] == c]
        if k > len(members):
            raise PartitionError(f"data.server_size = {size} needs {k} samples of {class_label(c, class_names)}, "
                                 f"only {len(members)} exist")
        picked.append(members[gen.permutation(len(members))[:k]])
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def from_clients(clients: list[np.ndarray], num_clients: int, per_client: int, seed: int) -> np.ndarray:
    """D0 from c clients × s samples (paper Scenario 2): c clients drawn once without replacement,
    s samples of each drawn without replacement. D0 then follows those clients' (non-IID) labels."""
    if not 1 <= num_clients <= len(clients):
        raise PartitionError(f"data.server_clients = {num_clients}: expected 1..{len(clients)} (data.num_clients)")
    gen = rng(seed, SERVER_DATA, 1)
    chosen = gen.choice(len(clients), size=num_clients, replace=False)
    picked = []
    for i in sorted(chosen):
        if per_client > len(clients[i]):
            raise PartitionError(f"data.server_samples_per_client = {per_client}: client {i} holds only "
                                 f"{len(clients[i])} samples")
        picked.append(clients[i][gen.permutation(len(clients[i]))[:per_client]])
    return np.sort(np.concatenate(picked))


def balanced_subset(labels: np.ndarray, size: int, seed: int, stream: tuple[int, ...] = (SERVER_DATA, 2),
                    setting: str = "data.server_size", source: str = "the server source") -> np.ndarray:
    """Positions of ``size`` samples of ``labels``, as class-balanced as the counts allow (a size budget),
    drawn from ``rng(seed, *stream)``; ``setting`` and ``source`` name the size and the labels in errors."""
    labels = np.asarray(labels)
    if size > len(labels):
        raise PartitionError(f"{setting} = {size}: {source} has only {len(labels)} samples")
    gen = rng(seed, *stream)
    queues = {c: list(np.flatnonzero(labels == c)[gen.permutation(int((labels == c).sum()))])
              for c in np.unique(labels)}
    picked: list[int] = []
    while len(picked) < size:  # round-robin over classes that still have samples
        for c in gen.permutation(list(queues)):
            if queues[c] and len(picked) < size:
                picked.append(queues[c].pop())
    return np.sort(np.asarray(picked, dtype=np.int64))


def uniform_subset(n: int, size: int, seed: int, stream: tuple[int, ...] = (SERVER_DATA, 2),
                   setting: str = "data.server_size", source: str = "the server source") -> np.ndarray:
    """Positions of ``size`` of ``n`` samples drawn uniformly without replacement from ``rng(seed, *stream)``,
    sorted: the IID sample of text windows, whose 'classes' (next characters) a per-class draw would distort."""
    if size > n:
        raise PartitionError(f"{setting} = {size}: {source} has only {n} samples")
    return np.sort(rng(seed, *stream).permutation(n)[:size]).astype(np.int64)
