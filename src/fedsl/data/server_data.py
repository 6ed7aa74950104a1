"""Sources of the server's dataset D0."""

from __future__ import annotations

import numpy as np

from fedsl.data.partition import PartitionError
from fedsl.engine.rng import SERVER_DATA, rng


def iid_per_class(labels: np.ndarray, size: int, seed: int, pool: np.ndarray | None = None) -> np.ndarray:
    """n0 samples with ≈ n0/L per class (paper, Scenario 1), drawn without replacement from ``pool``.

    The first n0 mod L classes (in a seeded order) get one sample more.
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
            raise PartitionError(f"data.server_size = {size} needs {k} samples of class {c}, only {len(members)} exist")
        picked.append(members[gen.permutation(len(members))[:k]])
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
