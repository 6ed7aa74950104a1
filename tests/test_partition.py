"""Partitions of a labelled pool: by_classes (the paper's N × C × n_i/C), iid, and the server's iid_per_class."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsl.data.partition import PartitionError, by_classes, iid
from fedsl.data.server_data import iid_per_class


def balanced_labels(num_classes: int, per_class: int, seed: int = 0, values=None) -> np.ndarray:
    """per_class samples of each class, shuffled (so indices and labels are not aligned)."""
    values = np.arange(num_classes) if values is None else np.asarray(values)
    y = np.repeat(values, per_class)
    return y[np.random.default_rng(seed).permutation(len(y))]


def largest_demand(N: int, C: int, n_i: int, L: int) -> int:
    """An upper bound on the samples any one class is asked for: ⌈N·C/L⌉ holders × ⌈n_i/C⌉."""
    return -(-(N * C) // L) * -(-n_i // C) if L else 0


def check_by_classes(labels, clients, N, C, n_i, pool=None):
    """All invariants of a by_classes partition."""
    labels = np.asarray(labels)
    allowed = np.arange(len(labels)) if pool is None else np.asarray(pool)
    classes = np.unique(labels)
    L = len(classes)
    base, extra = divmod(n_i, C)
    want_counts = sorted([base + 1] * extra + [base] * (C - extra), reverse=True)

    assert isinstance(clients, list) and len(clients) == N
    for idx in clients:
        assert isinstance(idx, np.ndarray) and idx.ndim == 1
        assert np.issubdtype(idx.dtype, np.integer)
        assert len(idx) == n_i
        assert np.all(np.diff(idx) > 0)  # sorted, no repeats
        assert np.isin(idx, allowed).all()  # only from the pool
        counts = Counter(labels[idx].tolist())
        assert len(counts) == C  # exactly C distinct classes
        assert sorted(counts.values(), reverse=True) == want_counts  # n_i/C each, remainder rule
    # pairwise disjoint
    if N:
        flat = np.concatenate(clients)
        assert len(np.unique(flat)) == len(flat) == N * n_i

    # class sets: each class held by ⌊NC/L⌋ or ⌈NC/L⌉ clients; all covered when NC >= L
    # (exactly C distinct classes per client is checked above: no client repeats a class)
    sets = [frozenset(np.unique(labels[idx]).tolist()) for idx in clients]
    holders = Counter(c for s in sets for c in s)
    lo, hi = (N * C) // L, -(-(N * C) // L)
    for c in classes.tolist():
        assert lo <= holders.get(c, 0) <= hi, (c, holders.get(c, 0), lo, hi)
    if N * C >= L:
        assert set(holders) == set(classes.tolist())

    return sets


# --------------------------------------------------------------------------- by_classes: paper settings, scaled down


PAPER_LIKE = [
    # (num_classes, per_class, N, C, n_i)
    (10, 500, 10, 2, 500),   # uses all the data: each class held by 2 clients × 250
    (10, 500, 20, 1, 250),   # one class per client
    (10, 500, 10, 10, 500),  # C = L (IID-like): 50 of each class per client, all the data
    (10, 500, 10, 3, 100),   # n_i mod C = 1: counts 34, 33, 33
    (10, 500, 7, 4, 30),     # N·C = 28 not a multiple of L; remainder 2: 8, 8, 7, 7
    (10, 500, 3, 2, 50),     # N·C = 6 < L: some classes unused
    (45, 40, 45, 3, 30),     # EMNIST-like, many classes: each class held by 3 clients × 10
    (47, 30, 90, 1, 15),     # 47 classes, C=1, 90 clients (uneven holder counts 1/2)
    (47, 30, 20, 47, 47),    # C = L with 47 classes: 1 of each per client
]


@pytest.mark.parametrize("L, per_class, N, C, n_i", PAPER_LIKE)
def test_by_classes_invariants_paper_like(L, per_class, N, C, n_i):
    labels = balanced_labels(L, per_class, seed=L + N)
    clients = by_classes(labels, N, C, n_i, seed=3)
    check_by_classes(labels, clients, N, C, n_i)


def test_by_classes_uses_all_data_when_demand_equals_supply():
    labels = balanced_labels(10, 500)
    for N, C, n_i in [(10, 2, 500), (20, 1, 250), (10, 10, 500), (5, 2, 1000)]:
        clients = by_classes(labels, N, C, n_i, seed=0)
        assert np.array_equal(np.sort(np.concatenate(clients)), np.arange(5000))


def test_by_classes_c1_first_l_clients_hold_every_class():
    # C = 1: the class sets are one permutation of the classes after another
    labels = balanced_labels(10, 500)
    clients = by_classes(labels, 20, 1, 250, seed=5)
    cls = [int(np.unique(labels[c])[0]) for c in clients]
    assert sorted(cls[:10]) == list(range(10)) and sorted(cls[10:]) == list(range(10))
    assert cls[10:] != cls[:10]  # a new permutation, not the first one dealt again


@pytest.mark.parametrize("C, at_least", [(2, 40), (3, 100), (5, 200)])
def test_by_classes_sets_are_as_varied_as_random_sets(C, at_least):
    """The paper's C classes per client at CIFAR-10's scale (L = 10, N = 1,000, n_i = 50): many distinct
    class sets (random C-sets give 45 pairs at C = 2, ~250 of 252 at C = 5; the old cyclic
    dealing gave 5 and 2), every class used by exactly N·C/L clients, the whole pool used."""
    labels = balanced_labels(10, 5000)
    clients = by_classes(labels, 1000, C, 50, seed=0)
    check_by_classes(labels, clients, 1000, C, 50)
    sets = [frozenset(np.unique(labels[c]).tolist()) for c in clients]
    assert len(set(sets)) >= at_least
    assert Counter(c for s in sets for c in s) == {c: 100 * C for c in range(10)}
    assert len(np.unique(np.concatenate(clients))) == 50_000


def test_by_classes_pairs_are_uniform_over_seeds():
    # every one of the 45 pairs appears about N / 45 times (not a few pairs held by 200 clients each)
    labels = balanced_labels(10, 5000)
    counts = Counter()
    for seed in range(3):
        counts.update(frozenset(np.unique(labels[c]).tolist()) for c in by_classes(labels, 1000, 2, 50, seed=seed))
    assert len(counts) == 45
    assert max(counts.values()) < 3 * 3000 / 45  # expected 66.7 each; the cyclic dealing gave 600


def test_by_classes_remainder_keeps_class_demand_level():
    # C = L = 3, n_i = 5: base 1, extra 2 -> counts (2, 2, 1) per client; the single goes to the class
    # demanded least so far, so over 10 clients each class gives 16 or 17 samples
    labels = balanced_labels(3, 100)
    clients = by_classes(labels, 10, 3, 5, seed=1)
    for idx in clients:
        assert sorted(Counter(labels[idx].tolist()).values()) == [1, 2, 2]
    per_class = Counter(labels[np.concatenate(clients)].tolist())
    assert sorted(per_class.values()) == [16, 17, 17]


def test_by_classes_non_contiguous_and_unbalanced_labels():
    # labels need not be 0..L-1; classes may be unbalanced as long as demand fits
    values = np.array([3, 7, 11, 42])
    y = np.repeat(values, [100, 40, 60, 80])
    y = y[np.random.default_rng(0).permutation(len(y))]
    clients = by_classes(y, 8, 2, 20, seed=0)  # each class held by 4 clients × 10 = 40
    check_by_classes(y, clients, 8, 2, 20)
    assert set(np.unique(y[np.concatenate(clients)]).tolist()) == set(values.tolist())


def test_by_classes_deterministic_and_seed_dependent():
    labels = balanced_labels(10, 500)
    a = by_classes(labels, 10, 2, 100, seed=7)
    b = by_classes(labels.copy(), 10, 2, 100, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = by_classes(labels, 10, 2, 100, seed=8)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))
    # the class assignment itself depends on the seed (over a few seeds, not all the same)
    def sets(cl):
        return tuple(frozenset(np.unique(labels[i]).tolist()) for i in cl)
    assert len({sets(by_classes(labels, 10, 2, 100, seed=s)) for s in range(6)}) > 1


def test_by_classes_does_not_mutate_inputs():
    labels = balanced_labels(5, 50)
    pool = np.arange(0, 250, 2)
    lab0, pool0 = labels.copy(), pool.copy()
    by_classes(labels, 4, 2, 10, seed=0, pool=pool)
    assert np.array_equal(labels, lab0) and np.array_equal(pool, pool0)


def test_by_classes_draws_only_from_pool():
    labels = balanced_labels(10, 500)
    rng = np.random.default_rng(0)
    # drop ~1/3 of the samples, e.g. the server's disjoint D0
    pool = np.sort(rng.choice(5000, size=3300, replace=False))
    clients = by_classes(labels, 10, 2, 300, seed=2, pool=pool)
    check_by_classes(labels, clients, 10, 2, 300, pool=pool)
    assert np.isin(np.concatenate(clients), pool).all()
    # pool as a python list works too and gives the same result
    clients2 = by_classes(labels, 10, 2, 300, seed=2, pool=pool.tolist())
    assert all(np.array_equal(x, y) for x, y in zip(clients, clients2))


def test_by_classes_pool_exhaustion_uses_exactly_the_pool():
    # pool = 20 samples per class of 4; N=4, C=2, n_i=20: each class held by 2 clients × 10
    labels = balanced_labels(4, 50)
    pool = np.sort(np.concatenate([np.flatnonzero(labels == c)[:20] for c in range(4)]))
    clients = by_classes(labels, 4, 2, 20, seed=0, pool=pool)
    check_by_classes(labels, clients, 4, 2, 20, pool=pool)
    # one more sample per client is too many
    with pytest.raises(PartitionError, match="has 20 samples"):
        by_classes(labels, 4, 2, 22, seed=0, pool=pool)
    assert np.array_equal(np.sort(np.concatenate(clients)), pool)


def test_by_classes_zero_clients():
    assert by_classes(balanced_labels(3, 5), 0, 1, 1, seed=0) == []


# --------------------------------------------------------------------------- by_classes: errors


def test_partition_error_is_a_value_error():
    assert issubclass(PartitionError, ValueError)


@pytest.mark.parametrize("C", [11, 12, 100, 0, -1])
def test_by_classes_classes_per_client_out_of_range(C):
    labels = balanced_labels(10, 50)
    with pytest.raises(PartitionError, match=r"data\.classes_per_client") as e:
        by_classes(labels, 5, C, 20, seed=0)
    assert str(C) in str(e.value) and "10" in str(e.value)


def test_by_classes_too_few_samples_per_client():
    with pytest.raises(PartitionError, match=r"data\.samples_per_client"):
        by_classes(balanced_labels(10, 50), 5, 3, 2, seed=0)


def test_by_classes_class_runs_out_names_class_and_fix():
    # class 3 has only 5 samples; C = L = 10 so every one of the 10 clients needs 1 of class 3
    y = np.concatenate([np.repeat([0, 1, 2, 4, 5, 6, 7, 8, 9], 100), np.full(5, 3)])
    with pytest.raises(PartitionError) as e:
        by_classes(y, 10, 10, 10, seed=0)
    msg = str(e.value)
    assert re.search(r"\bclass 3 has 5 samples\b", msg), msg
    assert "needs 10" in msg
    assert "data.samples_per_client" in msg and "data.num_clients" in msg and "data.classes_per_client" in msg


def test_by_classes_balanced_overdemand():
    # N=10, C=2, n_i=600 on 10 × 500: each class needs 2 × 300 = 600 > 500
    with pytest.raises(PartitionError, match=r"has 500 samples .*needs 600"):
        by_classes(balanced_labels(10, 500), 10, 2, 600, seed=0)


def test_by_classes_pool_without_enough_of_a_class():
    labels = balanced_labels(4, 50)
    pool = np.flatnonzero(labels != 2)  # class 2 missing from the pool entirely
    with pytest.raises(PartitionError, match=r"class 2 has 0 samples"):
        by_classes(labels, 4, 1, 10, seed=0, pool=pool)  # N·C = L: every class is dealt


# --------------------------------------------------------------------------- by_classes: property test


@st.composite
def settings_strategy(draw):
    L = draw(st.integers(0, 6))
    balanced = draw(st.booleans())
    if balanced:
        n = draw(st.integers(1, 25))
        counts = [n] * L
    else:
        counts = draw(st.lists(st.integers(1, 25), min_size=L, max_size=L))
    values = draw(st.permutations([0, 1, 2, 5, 9, 13, 100][: max(L, 0)])) if L else []
    y = np.repeat(np.asarray(values, dtype=np.int64), counts)
    y = y[np.random.default_rng(draw(st.integers(0, 2**16))).permutation(len(y))]
    N = draw(st.integers(0, 8))
    # mostly a valid C, sometimes 0 or L + 1 (out of range)
    C = draw(st.integers(1, L) if L and draw(st.sampled_from([True, True, True, False])) else st.integers(0, L + 1))
    n_i = draw(st.integers(0, 20) if draw(st.booleans()) else st.integers(max(C, 0), max(C, 0) + 4))
    seed = draw(st.integers(-3, 2**32))
    pool = None
    if len(y) and draw(st.booleans()):
        mask = np.asarray(draw(st.lists(st.booleans(), min_size=len(y), max_size=len(y))))
        pool = np.flatnonzero(mask)
    return y, N, C, n_i, seed, pool


@settings(max_examples=250, deadline=None)
@given(settings_strategy())
def test_by_classes_valid_or_partition_error(s):
    y, N, C, n_i, seed, pool = s
    classes = np.unique(y)
    L = len(classes)
    avail = y if pool is None else y[pool]
    have = {c: int(np.sum(avail == c)) for c in classes.tolist()}
    try:
        clients = by_classes(y, N, C, n_i, seed, pool)
    except PartitionError as e:
        msg = str(e)
        if not 1 <= C <= L:
            assert "data.classes_per_client" in msg
            return
        if n_i < C:
            assert "data.samples_per_client" in msg
            return
        m = re.search(r"class (\S+) has (\d+) samples .* needs (\d+)", msg)
        assert m, msg
        c, has, needs = int(m.group(1)), int(m.group(2)), int(m.group(3))
        assert has == have[c] < needs <= largest_demand(N, C, n_i, L)
        # not an error when every class could meet the largest demand
        assert min(have.values()) < largest_demand(N, C, n_i, L)
        return
    # success: parameters were valid and every invariant holds
    assert 1 <= C <= L and n_i >= C
    check_by_classes(y, clients, N, C, n_i, pool)
    # and the per-class supply actually covered what was taken
    if N:
        taken = Counter(y[np.concatenate(clients)].tolist())
        assert all(taken[c] <= have[c] for c in taken)
    # consistency with total supply
    assert N * n_i <= len(avail)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_by_classes_succeeds_when_every_class_meets_the_largest_demand(data):
    L = data.draw(st.integers(1, 6))
    C = data.draw(st.integers(1, L))
    N = data.draw(st.integers(0, 8))
    n_i = data.draw(st.integers(C, 15))
    need = largest_demand(N, C, n_i, L)
    counts = data.draw(st.lists(st.integers(max(need, 1), need + 5), min_size=L, max_size=L))
    y = np.repeat(np.arange(L), counts)
    y = y[np.random.default_rng(data.draw(st.integers(0, 99))).permutation(len(y))]
    seed = data.draw(st.integers(0, 2**32))
    check_by_classes(y, by_classes(y, N, C, n_i, seed), N, C, n_i)


# --------------------------------------------------------------------------- iid


def _check_iid(clients, N, n_i, allowed):
    assert len(clients) == N
    for idx in clients:
        assert len(idx) == n_i and np.all(np.diff(idx) > 0) and np.isin(idx, allowed).all()
    if N:
        flat = np.concatenate(clients)
        assert len(np.unique(flat)) == N * n_i


def test_iid_basic():
    clients = iid(1000, 10, 100, seed=0)
    _check_iid(clients, 10, 100, np.arange(1000))
    assert np.array_equal(np.sort(np.concatenate(clients)), np.arange(1000))  # uses all


def test_iid_partial():
    clients = iid(1000, 7, 33, seed=4)
    _check_iid(clients, 7, 33, np.arange(1000))


def test_iid_deterministic_and_seed_dependent():
    a = iid(500, 5, 50, seed=1)
    b = iid(500, 5, 50, seed=1)
    c = iid(500, 5, 50, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert any(not np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_pool():
    pool = np.arange(3, 1000, 3)  # 333 samples
    clients = iid(1000, 3, 111, seed=0, pool=pool)
    _check_iid(clients, 3, 111, pool)
    assert np.array_equal(np.sort(np.concatenate(clients)), pool)


def test_iid_too_many():
    with pytest.raises(PartitionError, match=r"data\.num_clients × data\.samples_per_client = 1010"):
        iid(1000, 10, 101, seed=0)
    with pytest.raises(PartitionError, match="exceeds the 10 samples"):
        iid(1000, 2, 6, seed=0, pool=np.arange(10))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 60), st.integers(0, 8), st.integers(0, 10), st.integers(0, 2**31), st.booleans())
def test_iid_valid_or_partition_error(n, N, n_i, seed, use_pool):
    pool = np.arange(0, n, 2) if use_pool else None
    avail = np.arange(n) if pool is None else pool
    try:
        clients = iid(n, N, n_i, seed, pool)
    except PartitionError:
        assert N * n_i > len(avail)
        return
    assert N * n_i <= len(avail)
    _check_iid(clients, N, n_i, avail)


# --------------------------------------------------------------------------- iid_per_class (server data D0)


def _check_server(idx, labels, size, allowed):
    assert isinstance(idx, np.ndarray) and np.issubdtype(idx.dtype, np.integer)
    assert len(idx) == size
    assert len(np.unique(idx)) == size  # without replacement
    assert np.all(np.diff(idx) > 0)  # sorted
    assert np.isin(idx, allowed).all()
    classes = np.unique(np.asarray(labels)[allowed])
    counts = [int(np.sum(labels[idx] == c)) for c in classes]
    assert max(counts) - min(counts) <= 1
    base = size // len(classes)
    assert set(counts) <= {base, base + 1}


@pytest.mark.parametrize("size", [0, 1, 9, 10, 47, 100, 333, 500])
def test_iid_per_class_sizes_and_balance(size):
    labels = balanced_labels(10, 60)
    idx = iid_per_class(labels, size, seed=0)
    _check_server(idx, labels, size, np.arange(len(labels)))


def test_iid_per_class_unbalanced_labels():
    y = np.repeat([0, 1, 2], [200, 30, 50])
    idx = iid_per_class(y, 89, seed=3)  # 30, 30, 29 in some order
    _check_server(idx, y, 89, np.arange(len(y)))


def test_iid_per_class_pool():
    labels = balanced_labels(5, 40)
    pool = np.arange(1, 200, 2)
    idx = iid_per_class(labels, 42, seed=0, pool=pool)
    _check_server(idx, labels, 42, pool)


def test_iid_per_class_deterministic_and_seed_dependent():
    labels = balanced_labels(10, 60)
    a = iid_per_class(labels, 55, seed=1)
    assert np.array_equal(a, iid_per_class(labels, 55, seed=1))
    assert not np.array_equal(a, iid_per_class(labels, 55, seed=2))


def test_iid_per_class_too_few_of_a_class():
    y = np.repeat([0, 1, 2, 3], [100, 100, 3, 100])
    with pytest.raises(PartitionError, match=r"data\.server_size = 40 needs 10 samples of class 2, only 3 exist"):
        iid_per_class(y, 40, seed=0)
    # same via a pool that leaves class 1 short
    labels = balanced_labels(4, 50)
    pool = np.concatenate([np.flatnonzero(labels == c)[: (2 if c == 1 else 50)] for c in range(4)])
    with pytest.raises(PartitionError, match="class 1, only 2 exist"):
        iid_per_class(labels, 20, seed=0, pool=pool)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 15), min_size=1, max_size=6), st.integers(0, 60), st.integers(0, 2**31))
def test_iid_per_class_valid_or_partition_error(counts, size, seed):
    y = np.repeat(np.arange(len(counts)), counts)
    L = len(counts)
    base, extra = divmod(size, L)
    try:
        idx = iid_per_class(y, size, seed)
    except PartitionError:
        # fails only if some class cannot give what it may be asked for
        assert min(counts) < base + (1 if extra else 0)
        return
    # succeeds whenever every class has room for base + 1 (and never when one has < base)
    assert min(counts) >= base
    _check_server(idx, y, size, np.arange(len(y)))
