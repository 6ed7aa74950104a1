"""The clients' states kept only where they exist: rows for the clients sampled so far, the rule's initial row for
the rest.

A stateful rule keeps one row of numbers per client between its rounds (SCAFFOLD's c_i, FedDyn's ∇L_i, MOON's
previous model y_i and its flag). Two stores hold them:

- ``dense`` (the default): [N, ...] tables, one row per client, whether it was ever sampled or not: what
  ``RunState.clients`` has always held (plain dicts of tensors; the simulator reads and writes the sampled rows).
- ``sparse`` (``ClientStore``, here): rows only for the clients seen so far, in order of first sampling; a client
  never sampled reads the rule's initial row, ``init_client_state(x_0)`` (zeros for every rule here: SCAFFOLD's
  c_i = 0, FedDyn's ∇L_i = 0, MOON's y_i = 0 with flag 0 = "no previous model yet"). Its memory is M × D numbers
  for M clients seen, D = the numbers of one client's state (d for SCAFFOLD and FedDyn, d + 1 for MOON), never
  N × D: with S clients a round, M <= min(N, S·T).

Choices (written down here, the only place):
- one store per run, one index for all its state keys: the keys of a client are always read and written together,
  so a client's whole state is one row of D numbers ([capacity, D], rows grown in chunks, doubled, so that growing
  costs O(1) per client seen), read with one gather and written with one scatter per round;
- the index is a dict from client id to row (O(1) per sampled client; about ``INDEX_BYTES`` of host memory per
  client seen, besides its row), and the ids in row order, which a checkpoint saves with the rows;
- the rows' number format: the run's (``dtype = 'auto'``: the values read back are the values written, so a sparse
  run equals a dense one bit for bit), or float16 (half of float32's memory; lossy: each number is rounded to
  float16, relative error <= 2^-11 for |v| >= 2^-14, absolute <= 2^-25 below; a value beyond float16's range,
  |v| > 65504, is refused rather than stored as inf);
- where the rows live: the run's device, host memory (``client_tables = 'host'``: the S sampled rows are copied to
  the device and back each round) or a memory-mapped file inside the run's folder (``on_disk``: ``STORE_FILE``,
  grown with the store; the operating system pages rows in and out, so M × D may exceed the memory). The file is a
  working copy: a checkpoint holds the store's ids and rows, and a resumed run rebuilds the file from it, so a run
  killed with kill -9 resumes bit for bit whatever the file held;
- gathered rows come out with the dense tables' memory layout (the initial row's, e.g. channels-last conv weights on
  a CPU), so that what the rule computes from them is the dense run's, to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsl.core.transfer import to_device
from fedsl.core.types import State

STORES = ("dense", "sparse")
STORE_DTYPES = ("auto", "float16")  # auto: the run's dtype (exact); float16: half the memory, lossy
STORE_FILE = "client_state.bin"  # the memory-mapped rows of a store on disk, in the run's folder
CHUNK = 64  # rows of a store's first allocation; each growth doubles the capacity
INDEX_BYTES = 120  # host memory of the index per client seen (a dict entry, its int objects, its id): ~115 measured
FLOAT16_MAX = 65504.0  # the largest finite float16


@dataclass(frozen=True)
class StoreSettings:
    """How a run keeps its clients' states (config's ``[client_state]`` table takes its defaults from here).

    Attributes:
        store: "dense" ([N, ...] tables) or "sparse" (rows of the clients seen: ``ClientStore``).
        dtype: the sparse rows' numbers: "auto" (the run's dtype; exact) or "float16" (lossy).
        on_disk: the sparse rows in a memory-mapped file in the run's folder (``STORE_FILE``), not in memory.
    """

    store: str = "dense"
    dtype: str = "auto"
    on_disk: bool = False

    @property
    def sparse(self) -> bool:
        return self.store == "sparse"

    def number_bytes(self, run_bytes: int) -> int:
        """Bytes of one stored number, for a run whose numbers take ``run_bytes``."""
        return 2 if self.sparse and self.dtype == "float16" else run_bytes

    def rows(self, num_clients: int, clients_per_round: int, rounds: int) -> int:
        """The most rows a run keeps: N (dense), or min(N, S·T) clients seen (sparse)."""
        return min(num_clients, clients_per_round * rounds) if self.sparse else num_clients


DENSE = StoreSettings()


@dataclass
class SavedStore:
    """A sparse store as a checkpoint keeps it (on the CPU): what ``ClientStore.restore`` rebuilds it from.

    Attributes:
        ids: [M] int64, the clients seen, in row order.
        rows: [M, D] their states, flattened in the initial state's order, in the store's dtype.
        initial: one client's initial state (the row the clients not seen read).
    """

    ids: torch.Tensor
    rows: torch.Tensor
    initial: State

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype


def store_dtype(settings: StoreSettings, run_dtype: torch.dtype) -> torch.dtype:
    """The rows' torch dtype: the run's, or float16."""
    return torch.float16 if settings.dtype == "float16" else run_dtype


def _layout(template: State) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(key, name, shape, numel) of every tensor of one client's state, in the state's order."""
    return [(k, n, tuple(v.shape), v.numel()) for k, g in template.items() for n, v in g.items()]


class ClientStore:
    """The sparse store: the rows of the clients seen so far (see the module docstring).

    Args:
        initial: the rule's ``init_client_state(x_0)``: one client's state, the row every client not yet seen
            reads (on the run's device, in the run's dtype: what ``gather`` returns).
        num_clients: N (ids are 0..N-1; nothing is allocated per client).
        device: where the rows live (the run's device, or the CPU for host memory and for a file).
        dtype: the rows' numbers (the run's dtype, or float16).
        path: a file for the rows (memory-mapped; created, or truncated, here); None: in memory.
    """

    def __init__(self, initial: State, num_clients: int, device: torch.device | str, dtype: torch.dtype,
                 path: str | Path | None = None) -> None:
        self.initial = {k: {n: v.detach() for n, v in g.items()} for k, g in initial.items()}
        self.layout = _layout(self.initial)
        self.width = sum(numel for *_, numel in self.layout)  # D
        first = next(iter(next(iter(self.initial.values())).values()))
        self.run_device, self.run_dtype = first.device, first.dtype
        self.num_clients = num_clients
        self.device = torch.device("cpu") if path is not None else torch.device(device)
        self.dtype = dtype
        self.path = Path(path) if path is not None else None
        self._index: dict[int, int] = {}
        self._map: np.memmap | None = None
        self._rows = self._allocate(CHUNK)
        self._ids = np.empty(CHUNK, dtype=np.int64)  # the client id of each row

    # ------------------------------------------------------------------ what it holds

    @property
    def rows_held(self) -> int:
        """M, the clients seen (each holds one row)."""
        return len(self._index)

    @property
    def capacity(self) -> int:
        return self._rows.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the rows allocated (in memory, or in the file), besides the index."""
        return self.capacity * self.width * self._rows.element_size()

    @property
    def ids(self) -> np.ndarray:
        """The clients seen, in row order (order of first sampling)."""
        return self._ids[:self.rows_held]

    # ------------------------------------------------------------------ a round's reads and writes

    def gather(self, ids: np.ndarray | list[int]) -> State:
        """The states of clients ``ids`` stacked [S, ...], on the run's device in its dtype: each seen client's
        row, the initial row for the others, in the dense tables' memory layout."""
        ids = np.asarray(ids, dtype=np.int64)
        s = len(ids)
        out = {k: {n: v.unsqueeze(0).expand(s, *v.shape).clone() for n, v in g.items()}
               for k, g in self.initial.items()}
        pos = self._positions(ids)
        seen = np.flatnonzero(pos >= 0)
        if len(seen):
            at = torch.from_numpy(pos[seen])
            flat = self._rows[at if self.device.type == "cpu" else to_device(at, self.device)]
            flat = to_device(flat, self.run_device, self.run_dtype)
            dest = to_device(torch.from_numpy(seen), self.run_device)
            col = 0
            for k, n, shape, numel in self.layout:
                out[k][n][dest] = flat[:, col:col + numel].reshape(len(seen), *shape)
                col += numel
        return out

    def scatter(self, ids: np.ndarray | list[int], rows: State) -> None:
        """Write the new states ``rows`` ([S, ...], stacked as ``gather`` returns them) of clients ``ids``, adding
        a row for each client seen for the first time."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"client ids {ids.tolist()}: expected each client once per write")
        if ids.min() < 0 or ids.max() >= self.num_clients:
            raise ValueError(f"client ids {ids.tolist()}: expected ids in 0..{self.num_clients - 1}")
        flat = torch.cat([rows[k][n].reshape(len(ids), numel) for k, n, _, numel in self.layout], dim=1)
        stored = to_device(flat, self.device, self.dtype)
        if self.dtype == torch.float16 and flat.dtype != torch.float16:
            self._check_range(flat, stored)  # before anything changes: a refused write leaves the store as it was
        pos = self._positions(ids)
        new = np.flatnonzero(pos < 0)
        if len(new):
            first = self.rows_held
            self._reserve(first + len(new))
            pos[new] = np.arange(first, first + len(new))
            self._ids[first:first + len(new)] = ids[new]
            self._index.update(zip(ids[new].tolist(), pos[new].tolist()))
        at = torch.from_numpy(pos)
        self._rows[at if self.device.type == "cpu" else to_device(at, self.device)] = stored

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row, -1 for a client not seen."""
        get = self._index.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), dtype=np.int64, count=len(ids))

    @staticmethod
    def _check_range(values: torch.Tensor, stored: torch.Tensor) -> None:
        """float16 rounding is the store's documented loss; an overflow to inf would be a silent corruption."""
        if not bool(torch.isfinite(stored).all()) and bool(torch.isfinite(values).all()):
            big = float(values.abs().max())
            raise ValueError(f"a client's state holds {big:.4g}, beyond float16's range (±{FLOAT16_MAX:g}): expected "
                             "client_state.dtype = 'auto' for this run")

    # ------------------------------------------------------------------ rows: memory or a file, grown in chunks

    def _allocate(self, capacity: int) -> torch.Tensor:
        """[capacity, D] rows, uninitialised beyond those held (read only through the index)."""
        if self.path is None:
            return torch.empty(capacity, self.width, dtype=self.dtype, device=self.device)
        np_dtype = torch.empty(0, dtype=self.dtype).numpy().dtype
        if self._map is None:  # a new file (a stale one, left by a killed run, is truncated: the checkpoint rules)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._map = np.memmap(self.path, dtype=np_dtype, mode="w+", shape=(capacity, self.width))
        else:
            self._map.flush()
            with open(self.path, "r+b") as f:
                f.truncate(capacity * self.width * np_dtype.itemsize)
            self._map = np.memmap(self.path, dtype=np_dtype, mode="r+", shape=(capacity, self.width))
        return torch.from_numpy(self._map)

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (doubling, so that each client seen costs O(1) copies over the run)."""
        if rows <= self.capacity:
            return
        capacity = max(rows, 2 * self.capacity)
        held = self.rows_held
        if self.path is None:
            grown = self._allocate(capacity)
            grown[:held] = self._rows[:held]
            self._rows = grown
        else:  # the file grows in place: the rows already in it stay where they are
            self._rows = self._allocate(capacity)
        ids = np.empty(capacity, dtype=np.int64)
        ids[:held] = self._ids[:held]
        self._ids = ids

    def close(self, remove: bool = False) -> None:
        """Write a file's rows out (``remove``: delete the file: nothing reads it once the run has ended)."""
        if self._map is not None:
            self._map.flush()
            if remove:
                self._rows = torch.empty(0, self.width, dtype=self.dtype)
                self._map = None
                assert self.path is not None
                self.path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ checkpoints

    def saved(self) -> SavedStore:
        """What a checkpoint keeps (``fedsl.runs.checkpoint``): the ids in row order, the held rows in the
        store's dtype (a file's are a tensor over the file, written from it, not copied into memory first) and the
        initial state."""
        held = self.rows_held
        rows = torch.from_numpy(self._map[:held]) if self._map is not None else self._rows[:held]
        return SavedStore(torch.from_numpy(self.ids.copy()), rows, self.initial)

    @classmethod
    def restore(cls, saved: SavedStore, num_clients: int, run_device: torch.device | str, run_dtype: torch.dtype,
                device: torch.device | str, path: str | Path | None = None) -> ClientStore:
        """A store from a checkpoint's ``saved()``: its initial row on the run's device in its dtype, its rows (in
        their saved dtype) where the run keeps them (``device``, or the file ``path``)."""
        rows, ids = saved.rows, saved.ids
        initial = {k: {n: to_device(v, run_device, run_dtype) for n, v in g.items()} for k, g in saved.initial.items()}
        store = cls(initial, num_clients, device, rows.dtype, path)
        if rows.dim() != 2 or rows.shape[1] != store.width or ids.shape != (rows.shape[0],):
            raise ValueError(f"the checkpoint's client states are {tuple(rows.shape)} rows for {tuple(ids.shape)} ids: "
                             f"expected [M, {store.width}] rows, one per id")
        held = len(ids)
        store._reserve(held)
        block = max(1, (64 * 2**20) // max(1, store.width * rows.element_size()))  # copied 64 MB at a time
        for a in range(0, held, block):
            b = min(a + block, held)
            store._rows[a:b] = to_device(rows[a:b], store.device)
        store._ids[:held] = ids.numpy()
        store._index = dict(zip(ids.tolist(), range(held)))
        return store


def float16_error_bound(values: torch.Tensor) -> torch.Tensor:
    """The most a number of ``values`` moves when stored in float16 (round to nearest): half a unit in the last
    place, 2^-11·|v| for normal numbers (|v| >= 2^-14), 2^-25 for subnormal ones."""
    return torch.maximum(values.abs().double() * 2.0**-11, torch.full_like(values, 2.0**-25, dtype=torch.float64))


def bytes_per_client(width: int, number_bytes: int) -> int:
    """Host or device memory of one client seen in a sparse store: its row (``width`` = D numbers of
    ``number_bytes``) and its index entry."""
    return width * number_bytes + INDEX_BYTES
