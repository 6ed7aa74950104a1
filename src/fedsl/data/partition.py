"""Partitions of a labelled pool over N clients: pure functions (labels, N, seed) -> index arrays.

``by_classes`` is the paper's (Section 4.1): each client gets n_i samples from C distinct
classes, n_i/C per class, drawn without replacement. Which C classes is random: the class
sets are cut from concatenated seeded permutations of the L labels, so every class is
used ⌊N·C/L⌋ or ⌈N·C/L⌉ times and the sets are as varied as random sets (at L = 10,
N = 1,000: all 45 pairs at C = 2, ~250 of the 252 sets at C = 5).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedsl.core.errors import DataError
from fedsl.core.rng import PARTITION, rng


class PartitionError(DataError):
    """A partition that the data cannot satisfy."""


def class_label(c, class_names: Sequence[str] | None) -> str:
    """How messages name label ``c``: "class 3 ('dog')" when the names are known, else "class 3"."""
    c = int(c)
    if class_names is not None and 0 <= c < len(class_names):
        return f"class {c} ({class_names[c]!r})"
    return f"class {c}"


def class_sets(num_classes: int, num_clients: int, classes_per_client: int, gen: np.random.Generator) -> np.ndarray:
    """[N, C] label positions 0..L-1: C distinct classes per client, every class used equally often.

    The N·C slots are filled by concatenated random permutations of the L classes and cut
    into groups of C. A group can repeat a class only where it straddles two permutations;
    such a repeat is swapped with a class of another group (chosen at random) that neither
    group then repeats, which keeps every class's count unchanged.
    """
    L, C, N = num_classes, classes_per_client, num_clients
    perms = -(-N * C // L)  # ⌈N·C/L⌉
    seq = np.concatenate([gen.permutation(L) for _ in range(perms)])[: N * C] if N else np.zeros(0, np.int64)
    groups = seq.reshape(N, C).copy()
    for i in range(N):
        while len(set(groups[i].tolist())) < C:
            row = groups[i].tolist()
            j = next(k for k in range(C) if row[k] in row[:k])  # the second occurrence of a repeat
            for other in gen.permutation(N):
                if other == i:
                    continue
                cand = [k for k in range(C) if groups[other, k] not in row
                        and groups[i, j] not in np.delete(groups[other], k)]
                if cand:
                    k = cand[gen.integers(len(cand))]
                    groups[i, j], groups[other, k] = groups[other, k], groups[i, j]
                    break
            else:  # not reached for C <= L (another group always lacks the repeated class); kept as a guard
                raise PartitionError(f"cannot give {N} clients {C} distinct classes each out of {L}")
    return groups


def by_classes(labels: np.ndarray, num_clients: int, classes_per_client: int, samples_per_client: int,
               seed: int, pool: np.ndarray | None = None,
               class_names: Sequence[str] | None = None) -> list[np.ndarray]:
    """The paper's non-IID partition: N clients × C classes × n_i/C samples each.

    Args:
        labels: label of every sample in the pool.
        num_clients: N.
        classes_per_client: C (C = number of classes is the IID-like case).
        samples_per_client: n_i; classes get ⌊n_i/C⌋ samples, n_i mod C of a client's classes
            (those demanded least by the clients before it) one more.
        seed: partition seed.
        pool: indices clients may draw from (default: all).
        class_names: name of each label, for messages only.
    """
    labels = np.asarray(labels)
    pool = np.arange(len(labels)) if pool is None else np.asarray(pool, dtype=np.int64)
    classes = np.unique(labels)
    L = len(classes)
    if not 1 <= classes_per_client <= L:
        present = set(classes.tolist())
        absent = [] if class_names is None else [n for i, n in enumerate(class_names) if i not in present]
        has = f"the dataset has {L} classes" if not absent else \
            f"the training pool has samples of {L} of the {len(class_names)} classes; none of {absent}"
        raise PartitionError(f"data.classes_per_client = {classes_per_client}: expected 1..{L} ({has})")
    if samples_per_client < classes_per_client:
        raise PartitionError(
            f"data.samples_per_client = {samples_per_client}: expected at least "
            f"data.classes_per_client = {classes_per_client}")
    gen = rng(seed, PARTITION)
    sets = classes[class_sets(L, num_clients, classes_per_client, gen)]
    base, extra = divmod(samples_per_client, classes_per_client)
    # n_i mod C classes of each client get one sample more: those demanded least so far, so that
    # class demands stay level (a pool used whole, like CIFAR-10 at N·n_i = 50,000, stays feasible)
    demand = {c: 0 for c in classes}
    takes = np.full(sets.shape, base, dtype=np.int64)
    for row, take in zip(sets, takes):
        if extra:
            order = sorted(range(classes_per_client), key=lambda j: (demand[row[j]], j))
            take[order[:extra]] += 1
        for c, k in zip(row, take):
            demand[c] += int(k)
    queues = {c: pool[labels[pool] == c] for c in classes}
    queues = {c: q[gen.permutation(len(q))] for c, q in queues.items()}  # shuffled sample queue per class
    supply = {c: len(q) for c, q in queues.items()}
    if extra:  # greedy leaves demands uneven by one: move extras from over-demanded classes where they fit
        for c in classes:
            for row, take in zip(sets, takes):
                if demand[c] <= supply[c]:
                    break
                j = np.flatnonzero(row == c)
                if len(j) and take[j[0]] > base:
                    d = next((k for k in range(classes_per_client) if take[k] == base
                              and demand[row[k]] < supply[row[k]]), None)
                    if d is not None:
                        take[j[0]] -= 1
                        take[d] += 1
                        demand[c] -= 1
                        demand[row[d]] += 1
    short = [c for c in classes if demand[c] > supply[c]]
    if short:
        c = short[0]
        raise PartitionError(
            f"{class_label(c, class_names)} has {len(queues[c])} samples but the partition (N={num_clients}, "
            f"C={classes_per_client}, n_i={samples_per_client}) needs {demand[c]}: lower "
            "data.samples_per_client or data.num_clients, or raise data.classes_per_client")
    taken = {c: 0 for c in classes}
    clients = []
    for row, take in zip(sets, takes):
        parts = []
        for c, k in zip(row, take):
            parts.append(queues[c][taken[c]:taken[c] + k])
            taken[c] += k
        clients.append(np.sort(np.concatenate(parts)))
    return clients


def iid(num_samples: int, num_clients: int, samples_per_client: int, seed: int,
        pool: np.ndarray | None = None) -> list[np.ndarray]:
    """IID partition: n_i samples per client drawn without replacement from the pool."""
    pool = np.arange(num_samples) if pool is None else np.asarray(pool, dtype=np.int64)
    need = num_clients * samples_per_client
    if need > len(pool):
        raise PartitionError(
            f"data.num_clients × data.samples_per_client = {need} exceeds the {len(pool)} samples available")
    order = pool[rng(seed, PARTITION).permutation(len(pool))][:need]
    return [np.sort(order[i * samples_per_client:(i + 1) * samples_per_client]) for i in range(num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int, pool: np.ndarray | None = None,
              min_size: int = 1, max_tries: int = 100) -> list[np.ndarray]:
    """Label skew by Dirichlet(α) (Hsu et al. 2019): each class is split over clients in proportions ~ Dir(α).

    Small α gives clients few dominant classes, large α approaches IID. Proportions are
    redrawn until every client holds at least ``min_size`` samples.
    """
    if alpha <= 0:
        raise PartitionError(f"data.dirichlet_alpha = {alpha}: expected > 0")
    labels = np.asarray(labels)
    pool = np.arange(len(labels)) if pool is None else np.asarray(pool, dtype=np.int64)
    if num_clients * min_size > len(pool):
        raise PartitionError(f"data.num_clients = {num_clients}: more clients than the {len(pool)} samples allow")
    gen = rng(seed, PARTITION)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels[pool]):
            members = pool[labels[pool] == c]
            members = members[gen.permutation(len(members))]
            cuts = (np.cumsum(gen.dirichlet(np.full(num_clients, alpha))) * len(members)).astype(int)[:-1]
            for i, chunk in enumerate(np.split(members, cuts)):
                parts[i].append(chunk)
        clients = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(c) for c in clients) >= min_size:
            return clients
    raise PartitionError(f"data.dirichlet_alpha = {alpha}: after {max_tries} draws some client still had fewer "
                         f"than {min_size} samples; raise the alpha or lower data.num_clients")


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int,
           pool: np.ndarray | None = None) -> list[np.ndarray]:
    """McMahan et al. (2017): sort by label, cut into N·s equal shards, give each client s random shards."""
    labels = np.asarray(labels)
    pool = np.arange(len(labels)) if pool is None else np.asarray(pool, dtype=np.int64)
    total = num_clients * shards_per_client
    if shards_per_client < 1 or total > len(pool):
        raise PartitionError(f"data.shards_per_client = {shards_per_client}: expected >= 1 and "
                             f"N·s <= {len(pool)} samples")
    gen = rng(seed, PARTITION)
    # a seeded shuffle first, then a stable sort: ties within a class are in random order
    order = pool[gen.permutation(len(pool))]
    order = order[np.argsort(labels[order], kind="stable")]
    size = len(order) // total
    cut = [order[k * size:(k + 1) * size] for k in range(total)]
    assignment = gen.permutation(total)
    return [np.sort(np.concatenate([cut[k] for k in assignment[i::num_clients]])) for i in range(num_clients)]


def skewed_sizes(total: int, num_clients: int, beta: float, seed: int, min_size: int = 1) -> np.ndarray:
    """Client sizes ∝ Dir(β) (quantity skew), each >= ``min_size``, summing to ``total``."""
    if beta <= 0:
        raise PartitionError(f"data.quantity_skew = {beta}: expected > 0")
    if num_clients * min_size > total:
        raise PartitionError(f"data.num_clients = {num_clients}: more clients than the {total} samples allow")
    p = rng(seed, PARTITION, 1).dirichlet(np.full(num_clients, beta))
    spare = total - num_clients * min_size
    sizes = min_size + np.floor(p * spare).astype(int)
    sizes[np.argsort(-p)[: total - sizes.sum()]] += 1  # hand out the rounding remainder
    return sizes


def iid_sizes(num_samples: int, sizes: np.ndarray, seed: int, pool: np.ndarray | None = None) -> list[np.ndarray]:
    """IID labels with given client sizes (e.g. from ``skewed_sizes``)."""
    pool = np.arange(num_samples) if pool is None else np.asarray(pool, dtype=np.int64)
    if sizes.sum() > len(pool):
        raise PartitionError(f"client sizes add up to {sizes.sum()}, more than the {len(pool)} samples available")
    order = pool[rng(seed, PARTITION).permutation(len(pool))]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [np.sort(order[bounds[i]:bounds[i + 1]]) for i in range(len(sizes))]
