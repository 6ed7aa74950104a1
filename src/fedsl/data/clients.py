"""The clients' data D_1, ..., D_N as one index array and N + 1 offsets (compressed sparse rows), not N arrays.

A federation of N clients used to hold a Python list of N index arrays: about 100 bytes of array header per
client besides its indices, and every pass over the clients a Python loop. ``ClientIndex`` keeps

- ``offsets`` [N + 1] int64: client i's samples are positions ``offsets[i]:offsets[i + 1]`` of
- ``indices`` [n] int64: the pool indices of every client's samples, client after client (None: implicit, client
  i's are the positions themselves, ``arange(offsets[i], offsets[i + 1])``: clients whose samples are made on
  demand and live in no pool, ``fedsl.data.synthetic_fedprox``);
- ``shared`` (optional): pool indices appended to every client's own (data sharing, DS: D'_i = D_i ∪ D0),
  stored once rather than N times.

Memory: 8 bytes per client (its offset) plus 8 per sample index; an implicit index holds the offsets only.
``clients[i]`` is client i's array (a view of ``indices``; with ``shared``, a new array D_i ∪ D0, exactly what
``np.concatenate([D_i, D0])`` gave), so code written for a list of arrays reads it unchanged (``len``,
iteration, ``np.concatenate(clients)``); whole-federation passes use ``sizes``, ``indices`` and ``owners``
instead of a loop over clients.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

OFFSET_BYTES = 8  # host memory per client of a ClientIndex (its int64 offset), besides its sample indices
INDEX_BYTES = 8  # per sample index (int64)


class ClientIndex(Sequence):
    """D_1..D_N as CSR (see the module docstring): ``clients[i]`` is client i's pool indices."""

    __slots__ = ("offsets", "_indices", "shared")

    def __init__(self, offsets: np.ndarray, indices: np.ndarray | None = None, shared: np.ndarray | None = None):
        self.offsets = np.asarray(offsets, dtype=np.int64)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0 or \
                (len(self.offsets) > 1 and np.any(np.diff(self.offsets) < 0)):
            raise ValueError("client offsets: expected a non-decreasing int64 array starting at 0")
        if indices is not None:
            indices = np.asarray(indices, dtype=np.int64)
            if indices.shape != (int(self.offsets[-1]),):
                raise ValueError(f"client indices: expected {int(self.offsets[-1])} (the last offset), "
                                 f"got shape {indices.shape}")
        self._indices = indices
        self.shared = None if shared is None else np.asarray(shared, dtype=np.int64)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray]) -> "ClientIndex":
        """From one index array per client (what the partitions return); a ClientIndex is returned as it is."""
        if isinstance(arrays, ClientIndex):
            return arrays
        sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        indices = (np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays]) if len(arrays)
                   else np.zeros(0, dtype=np.int64))
        return cls(offsets, indices)

    @classmethod
    def from_sizes(cls, sizes: np.ndarray) -> "ClientIndex":
        """Implicit: client i holds ``sizes[i]`` samples at positions of its own (no pool indices stored)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(offsets)

    @classmethod
    def from_owners(cls, owners: np.ndarray, num_clients: int | None = None) -> "ClientIndex":
        """One client per owner id 0..N-1 (a natural partition: writer, user, device): client i holds the pool
        positions p with ``owners[p] == i``, in increasing order."""
        owners = np.asarray(owners, dtype=np.int64)
        n = int(owners.max()) + 1 if num_clients is None and len(owners) else (num_clients or 0)
        if len(owners) and (owners.min() < 0 or owners.max() >= n):
            raise ValueError(f"owner ids: expected integers in 0..{n - 1}")
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owners, minlength=n), out=offsets[1:])
        return cls(offsets, np.argsort(owners, kind="stable"))

    def with_shared(self, shared: np.ndarray) -> "ClientIndex":
        """Every client's own indices followed by ``shared`` (DS: D_i ∪ D0), ``shared`` stored once."""
        if self.shared is not None:
            raise ValueError("these clients already share data")
        return ClientIndex(self.offsets, self._indices, shared)

    # ------------------------------------------------------------------ reading

    @property
    def implicit(self) -> bool:
        """No pool indices stored: the clients' samples are made on demand."""
        return self._indices is None

    @property
    def own_sizes(self) -> np.ndarray:
        """n_i of every client, its own samples (without ``shared``) [N]: O(N), for the federation's setup."""
        return np.diff(self.offsets)

    def sizes_of(self, ids) -> np.ndarray:
        """n_i of clients ``ids``, their own samples: O(len(ids)), what a round reads."""
        ids = np.asarray(ids, dtype=np.int64)
        return self.offsets[ids + 1] - self.offsets[ids]

    @property
    def sizes(self) -> np.ndarray:
        """|D_i| of every client [N], ``shared`` included."""
        return self.own_sizes + (0 if self.shared is None else len(self.shared))

    @property
    def total(self) -> int:
        """n = Σ n_i, the clients' own samples."""
        return int(self.offsets[-1])

    @property
    def indices(self) -> np.ndarray:
        """Every client's own pool indices, client after client (= ``np.concatenate`` of the clients' own)."""
        return np.arange(self.total, dtype=np.int64) if self._indices is None else self._indices

    def owners(self) -> np.ndarray:
        """The client of each entry of ``indices`` [n]."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.own_sizes)

    def own(self, i: int) -> np.ndarray:
        """Client i's own pool indices (without ``shared``)."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return np.arange(a, b, dtype=np.int64) if self._indices is None else self._indices[a:b]

    @property
    def nbytes(self) -> int:
        """Host memory of the index: offsets, indices and the shared part."""
        return (self.offsets.nbytes + (0 if self._indices is None else self._indices.nbytes)
                + (0 if self.shared is None else self.shared.nbytes))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(np.int64(i)) if isinstance(i, np.integer) else i
        if not isinstance(i, int):
            raise TypeError(f"client index {i!r}: expected an integer or a slice")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"client {i}: expected 0..{n - 1}")
        own = self.own(i % n)
        return own if self.shared is None else np.concatenate([own, self.shared])

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"ClientIndex(N={len(self)}, n={self.total}{', implicit' if self.implicit else ''})"
