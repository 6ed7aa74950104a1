"""The natural partition (``data.partition = 'natural'``): one client per id of the files (writer, user, device).

The loader tags each training sample with its client (``ImageSet.owners``, 0..U-1 in the loader's stated order:
sorted id names; ``ImageSet.owner_names``). Client i holds exactly the samples of id i, in file order, as one CSR
``ClientIndex`` (8 bytes per client plus 8 per sample, no Python object per client).

- ``data.num_clients`` = N is at most U: the federation is the first N ids in that order (N < U: a fixed,
  seed-free subset, e.g. to try FEMNIST on fewer writers); N > U is refused in one line.
- The test split: the test samples of those N ids, pooled (LEAF's global test accuracy).
- D0: 'iid' draws from the N ids' training samples (with ``data.server_overlap = false`` they leave their
  clients; a client left with no sample is refused), 'clients' takes s samples of c of the N clients, 'dataset'
  reads another source; every one as for the other partitions; 'other_ids' takes the training samples of the c ids
  after the N clients' (ids N..N+c−1: people, roles or writers the server holds and no client is).
"""

from __future__ import annotations

import numpy as np

from fedsl.data.clients import ClientIndex
from fedsl.data.partition import PartitionError
from fedsl.sources.arrays import ImageSet


def _owners(split: ImageSet, dataset: str) -> np.ndarray:
    if split.owners is None:
        raise PartitionError(f"data.partition = 'natural': data.dataset = {dataset!r} has no id per sample; "
                             "expected a dataset with natural ids ('leaf', 'hf_files')")
    return split.owners


def num_ids(train: ImageSet, dataset: str) -> int:
    """U, the ids with training samples."""
    owners = _owners(train, dataset)
    return len(train.owner_names) if train.owner_names is not None else int(owners.max(initial=-1)) + 1


def pool(train: ImageSet, num_clients: int, dataset: str) -> np.ndarray:
    """The training samples of the federation's N = ``num_clients`` ids (the first N), sorted."""
    u = num_ids(train, dataset)
    if num_clients > u:
        raise PartitionError(f"data.num_clients = {num_clients}: the files hold {u} ids with training samples "
                             f"(data.partition = 'natural': one client per id); expected at most {u}")
    owners = _owners(train, dataset)
    return np.flatnonzero((owners >= 0) & (owners < num_clients))


def clients(train: ImageSet, positions: np.ndarray, num_clients: int, dataset: str) -> ClientIndex:
    """Client i = the samples of ``positions`` whose id is i (i < N), in increasing position; every client must
    keep a sample (D0 taken out of the pool can empty one)."""
    owners = _owners(train, dataset)[positions]
    index = ClientIndex.from_owners(owners, num_clients)
    index = ClientIndex(index.offsets, np.asarray(positions, dtype=np.int64)[index.indices])
    empty = np.flatnonzero(index.own_sizes == 0)
    if len(empty):
        i = int(empty[0])
        name = train.owner_names[i] if train.owner_names is not None else str(i)
        raise PartitionError(f"data.partition = 'natural': client {i} (id {name!r}) has no training sample left "
                             "once D0 left the pool (data.server_overlap = false); expected D0 drawn "
                             "with server_overlap = true, or a smaller data.server_size")
    return index


def evaluated(test: ImageSet, num_clients: int, dataset: str) -> np.ndarray | None:
    """Positions of the test samples of the federation's N ids; None when that is the whole split."""
    owners = _owners(test, dataset)
    keep = (owners >= 0) & (owners < num_clients)
    return None if keep.all() else np.flatnonzero(keep)


def other_ids(train: ImageSet, num_clients: int, count: int, dataset: str) -> np.ndarray:
    """The training samples of ids N..N+c−1 (``data.server_source = 'other_ids'``: D0 from ids that are not
    clients), sorted."""
    u = num_ids(train, dataset)
    if num_clients + count > u:
        raise PartitionError(f"data.server_clients = {count}: D0 takes the ids after the N = {num_clients} clients' "
                             f"and the files hold {u} ids with training samples; expected N + c at most {u}")
    owners = _owners(train, dataset)
    return np.flatnonzero((owners >= num_clients) & (owners < num_clients + count))
