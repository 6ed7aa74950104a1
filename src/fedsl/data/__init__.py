"""The federation any source becomes: the clients' datasets, D0 and the test set, as the config describes them.

- ``registry``: every dataset by name (its reader in ``fedsl.sources``, sizes, classes, statistics), the table the
  config and the CLI read; ``datasets``: the loader, from a config to an ``ArrayDataset`` and its federation;
- ``partition`` (classes per client, Dirichlet, IID, by quantity), ``natural`` (one client per writer or role),
  ``server_data`` (D0 carved from the pool or from another source), ``clients`` and ``federation`` (the clients'
  index tables the engine reads), ``poisoning`` (attackers' labels);
- ``generated`` and the benchmarks whose clients are generated, not read: ``synthetic_fedprox`` (Synthetic(α, β))
  and ``synthetic_leaf``.

It may import ``core`` and ``sources``. The readers that lived here are in ``fedsl.sources`` and the data errors in
``fedsl.core.errors``: ``fedsl.data.cifar10`` and the other old names import for one release, with a
DeprecationWarning, as the new module itself (``MOVED``).
"""

from fedsl.core.moved import alias_moved

MOVED = {name: f"fedsl.sources.{name}" for name in (
    "arrays", "download", "idx", "cifar10", "emnist", "mnist", "stl10", "image_folder", "shakespeare", "leaf",
    "hf_files", "array_files", "synthetic", "toy")}
MOVED |= {"idx_files": "fedsl.sources.idx", "errors": "fedsl.core.errors"}

alias_moved(__name__, MOVED)
