"""N up to 10^6 (``fedsl.data.clients``, ``fedsl.engine.simulator``): the clients' index arrays as one CSR
``ClientIndex`` that reads as the list of arrays it replaces, S of N drawn in O(S) and unchanged for every existing
config, a round that touches only its S clients, the cap at 10^6 in one line."""

import hashlib
import time
import tracemalloc

import numpy as np
import pytest
import torch
from conftest import random_federation

from fedsl.algorithms.label_counts import label_counts
from fedsl.config.schema import CLIENTS_MAX, ConfigError, validate
from fedsl.core import rng
from fedsl.data.clients import ClientIndex
from fedsl.data.datasets import build_federation
from fedsl.runs.build import prepare

pytestmark = pytest.mark.usefixtures("one_thread")

# rng.sample_clients(0, t, 1000, 10), t = 0..4 (the paper's CIFAR-10 setting: N = 1,000, S = 10), recorded before the
# clients became a ClientIndex; the committed reproduction numbers rest on these draws
PAPER_DRAWS = [[24, 162, 288, 388, 445, 574, 605, 763, 881, 948], [226, 252, 333, 482, 668, 783, 811, 841, 923, 967],
               [139, 220, 238, 319, 402, 514, 644, 826, 835, 958], [14, 32, 145, 465, 519, 532, 534, 610, 801, 910],
               [324, 368, 481, 591, 656, 670, 810, 843, 887, 990]]
# the toy config below, rounds 0-2: sampled ids, n_i, and digests of the batch plan's indices and dropout keys,
# recorded before the change (FSL: D_i; DS: D_i ∪ D0)
TOY_WORK = {
    "fsl": [([6, 8, 10, 11], [10] * 4, "7749bdda1b772ba5", "23d2003fa4f906f0"),
            ([4, 8, 11, 12], [10] * 4, "55b389c4f5ee15bd", "a2771807e83da3da"),
            ([5, 8, 11, 15], [10] * 4, "d8344acc56d74bb9", "4c1d6646fe00143b")],
    "ds": [([6, 8, 10, 11], [18] * 4, "731e16381dea259e", "017e80b769408f0c"),
           ([4, 8, 11, 12], [18] * 4, "24bf46957264d5be", "2b51f2a6b800b359"),
           ([5, 8, 11, 15], [18] * 4, "2be6f554530215ad", "c82dd6a6104fb842")],
}


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def test_sampled_clients_and_their_batches_are_those_of_before():
    assert [rng.sample_clients(0, t, 1000, 10).tolist() for t in range(5)] == PAPER_DRAWS
    for algo, rows in TOY_WORK.items():
        cfg = validate({"rounds": 3, "seed": 5, "data": {"dataset": "toy", "num_clients": 16, "server_size": 8,
                                                         "classes_per_client": 2},
                        "model": {"name": "linear"}, "algorithm": {"name": algo, "clients_per_round": 4,
                                                                   "batch_size": 3}})
        sim = prepare(cfg).sim
        for t, (ids, sizes, idx, keys) in enumerate(rows):
            w = sim.sample(t)
            assert (w.ids.tolist(), list(w.sizes), _digest(w.plan.idx), _digest(w.plan.keys)) == (ids, sizes, idx, keys)


def test_sampling_s_of_a_million_allocates_o_of_s():
    """numpy draws S of N without replacement by Floyd's algorithm (S ≤ N/50): no array of N is made."""
    tracemalloc.start()
    for t in range(20):
        ids = rng.sample_clients(0, t, 10**6, 100)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(np.unique(ids)) == 100 and ids.max() < 10**6 and peak < 100_000  # an arange(N) would be 8 MB


def test_client_index_reads_as_the_list_of_arrays_it_replaces():
    arrays = [np.array([5, 1, 7]), np.array([], dtype=np.int64), np.array([2]), np.array([9, 0])]
    ci = ClientIndex.from_arrays(arrays)
    assert len(ci) == 4 and ci.total == 6 and ci.sizes.tolist() == [3, 0, 1, 2] and ci.nbytes == 8 * 5 + 8 * 6
    assert [c.tolist() for c in ci] == [a.tolist() for a in arrays] and ci[-1].tolist() == [9, 0]
    assert ci[np.int64(2)].tolist() == [2] and [c.tolist() for c in ci[1:3]] == [[], [2]]
    assert np.concatenate(ci).tolist() == ci.indices.tolist() == [5, 1, 7, 2, 9, 0]
    assert ci.owners().tolist() == [0, 0, 0, 2, 3, 3] and ci.sizes_of([3, 0]).tolist() == [2, 3]
    shared = ci.with_shared(np.array([11, 12]))  # DS: D_i ∪ D0, D0 stored once
    assert [c.tolist() for c in shared] == [np.concatenate([a, [11, 12]]).tolist() for a in arrays]
    assert shared.sizes.tolist() == [5, 2, 3, 4] and shared.own_sizes.tolist() == [3, 0, 1, 2]
    implicit = ClientIndex.from_sizes([2, 3])
    assert implicit.implicit and implicit.nbytes == 24 and implicit[1].tolist() == [2, 3, 4]
    natural = ClientIndex.from_owners(np.array([1, 0, 1, 2, 0]))
    assert [c.tolist() for c in natural] == [[1, 4], [0, 2], [3]]
    with pytest.raises(IndexError, match=r"client 4: expected 0..3"):
        ci[4]
    with pytest.raises(ValueError, match="expected 6"):
        ClientIndex(ci.offsets, np.zeros(5))


def test_label_counts_in_one_pass_equal_a_count_per_client():
    fed = random_federation([3, 0, 5, 4], num_classes=3)
    y = fed.y.numpy()
    for clients in (fed.clients, fed.clients.with_shared(fed.server)):
        counts = label_counts(fed.y, clients, fed.server, 3)
        by_client = np.stack([np.bincount(y[c], minlength=3) for c in clients]).astype(np.float64)
        assert np.array_equal(counts.clients, by_client) and counts.clients.dtype == np.float64


def test_the_cap_is_a_million_clients_in_one_line():
    base = {"rounds": 1, "algorithm": {"name": "fedavg"}}
    assert CLIENTS_MAX == 10**6
    assert validate({**base, "data": {"dataset": "synthetic_fedprox", "num_clients": 10**6}}).data.num_clients == 10**6
    with pytest.raises(ConfigError) as e:
        validate({**base, "data": {"dataset": "toy", "num_clients": 10**6 + 1}})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.num_clients = 1000001") and "at most 1,000,000" in msg


def test_a_million_generated_clients_build_and_sample_in_little_memory_and_time():
    """N = 10^6 clients of Synthetic(α, β) (samples made on demand): the federation holds 8 bytes a client, a
    round's host work (sampling, the sampled clients' samples, their plans) allocates for its S clients only."""
    cfg = validate({"rounds": 3, "data": {"dataset": "synthetic_fedprox", "num_clients": 10**6, "server_size": 50,
                                          "synthetic_max_samples": 50, "synthetic_test_clients": 20},
                    "model": {"name": "logreg"}, "algorithm": {"name": "fsl", "clients_per_round": 10,
                                                               "batch_size": 5}})
    tracemalloc.start()
    start = time.perf_counter()
    fed = build_federation(cfg.data, cfg.seed)
    built, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert fed.num_clients == 10**6 and fed.n == 45 * 10**6 and fed.clients.nbytes == 8 * (10**6 + 1)
    assert peak < 64 * 2**20 and built < 20  # the sizes' draw and offsets: ~24 MB at once, about a second
    sim = prepare(cfg).sim
    sim.sample(0)
    tracemalloc.start()
    start = time.perf_counter()
    works = [sim.sample(t) for t in range(1, 4)]
    per_round, peak = (time.perf_counter() - start) / 3, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert all(len(w.ids) == 10 and w.sizes == [45] * 10 and len(w.pool[0]) == 50 + 450 for w in works)
    assert peak < 2**20 and per_round < 2  # a byte per client would be 1 MB; measured ~0.2 MB, ~10 ms
