"""Dirichlet, shards, quantity skew and server-data sources: invariants."""

import numpy as np
import pytest

from fedsl.data import partition as P
from fedsl.data import server_data as SD

LABELS = np.repeat(np.arange(10), 100)  # 10 classes x 100


def _disjoint_within(clients, pool_size):
    allidx = np.concatenate(clients)
    assert len(np.unique(allidx)) == len(allidx)
    assert allidx.min() >= 0 and allidx.max() < pool_size


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_dirichlet_covers_pool_disjointly(alpha):
    clients = P.dirichlet(LABELS, 20, alpha, seed=1)
    _disjoint_within(clients, len(LABELS))
    assert sum(len(c) for c in clients) == len(LABELS)
    assert min(len(c) for c in clients) >= 1
    # small alpha concentrates each client's labels; large alpha spreads them
    top_share = np.mean([np.bincount(LABELS[c], minlength=10).max() / len(c) for c in clients])
    if alpha == 0.05:
        assert top_share > 0.8
    if alpha == 100.0:
        assert top_share < 0.35


def test_dirichlet_deterministic_and_errors():
    a, b = P.dirichlet(LABELS, 8, 0.3, seed=2), P.dirichlet(LABELS, 8, 0.3, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(P.PartitionError, match="dirichlet_alpha = 0"):
        P.dirichlet(LABELS, 8, 0, seed=2)
    with pytest.raises(P.PartitionError, match="data.num_clients = 2000"):
        P.dirichlet(LABELS, 2000, 0.3, seed=2)


def test_shards_give_each_client_s_shards_of_few_labels():
    clients = P.shards(LABELS, 50, 2, seed=0)
    _disjoint_within(clients, len(LABELS))
    assert all(len(c) == 20 for c in clients)  # 1000 / 100 shards = 10 per shard
    assert all(len(np.unique(LABELS[c])) <= 2 for c in clients)  # a shard lies in one class here
    with pytest.raises(P.PartitionError, match="shards_per_client = 0"):
        P.shards(LABELS, 50, 0, seed=0)


def test_quantity_skew_sizes():
    sizes = P.skewed_sizes(1000, 10, 0.5, seed=3)
    assert sizes.sum() == 1000 and sizes.min() >= 1 and sizes.max() > 2 * sizes.min()
    clients = P.iid_sizes(len(LABELS), sizes, seed=3)
    assert [len(c) for c in clients] == sizes.tolist()
    _disjoint_within(clients, len(LABELS))
    with pytest.raises(P.PartitionError, match="quantity_skew = -1"):
        P.skewed_sizes(1000, 10, -1, seed=3)


def test_server_from_a_few_clients():
    clients = P.by_classes(LABELS, 20, 1, 50, seed=0)
    d0 = SD.from_clients(clients, 4, 10, seed=0)
    assert len(d0) == 40 and len(np.unique(d0)) == 40
    owners = {i for i, c in enumerate(clients) if np.intersect1d(c, d0).size}
    assert len(owners) == 4 and all(np.intersect1d(clients[i], d0).size == 10 for i in owners)
    assert len(np.unique(LABELS[d0])) <= 4  # non-IID: the labels of those 4 clients only
    assert np.array_equal(d0, SD.from_clients(clients, 4, 10, seed=0))
    with pytest.raises(P.PartitionError, match="server_clients = 30"):
        SD.from_clients(clients, 30, 10, seed=0)
    with pytest.raises(P.PartitionError, match="server_samples_per_client = 51"):
        SD.from_clients(clients, 2, 51, seed=0)


def test_balanced_subset_budget():
    labels = np.array([0] * 50 + [1] * 5 + [2] * 30)
    idx = SD.balanced_subset(labels, 30, seed=0)
    counts = np.bincount(labels[idx], minlength=3)
    assert counts.sum() == 30 and counts[1] == 5 and abs(counts[0] - counts[2]) <= 1
    with pytest.raises(P.PartitionError, match="server_size = 100"):
        SD.balanced_subset(labels, 100, seed=0)
