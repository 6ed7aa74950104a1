"""Deprecated names: what ``fedsl.experiments`` held now lives in packages named for their jobs.

- ``fedsl.config``: the config's tables, reading it (files, presets, ``--set``), own keys, defaults resolved;
- ``fedsl.runs``: a run built from its config, driven, kept in its folder and resumed;
- ``fedsl.sweeps``: a config's runs (``fedsl.config.expand``) run as a group, in parallel or on Ray, extended;
- ``fedsl.tune``: studies on validation data; ``fedsl.assess``: how useful a server dataset D0 is.

``import fedsl.experiments.X`` (and ``from fedsl.experiments import X``) still works for one release: it warns
(DeprecationWarning) and gives the module's new object itself, so that what is set on one is set on the other and
checkpoints pickled under the old names load. ``MOVED`` is the table (``fedsl.core.moved``). It may import ``core``
only: the new modules are named, as strings.
"""

from fedsl.core.moved import alias_moved

MOVED = {
    "config": "fedsl.config.schema", "config_base": "fedsl.config.base", "config_data": "fedsl.config.data_keys",
    "config_tables": "fedsl.config.tables", "own_keys": "fedsl.config.own_keys", "loading": "fedsl.config.loading",
    "presets": "fedsl.config.presets", "resolve": "fedsl.config.resolve", "tune_space": "fedsl.config.tune_space",
    "tune_storage": "fedsl.config.tune_storage",
    "build": "fedsl.runs.build", "runner": "fedsl.runs.runner", "checkpoint": "fedsl.runs.checkpoint",
    "results": "fedsl.runs.results", "run_files": "fedsl.runs.files", "run_status": "fedsl.runs.status",
    "callbacks": "fedsl.runs.callbacks", "progress": "fedsl.runs.progress", "interrupts": "fedsl.runs.interrupts",
    "divergence": "fedsl.runs.divergence", "tracking": "fedsl.runs.tracking", "placement": "fedsl.runs.placement",
    "memory": "fedsl.runs.memory", "record": "fedsl.runs.record",
    "sweep": "fedsl.config.expand", "compare": "fedsl.sweeps.compare", "parallel": "fedsl.sweeps.parallel",
    "ray_backend": "fedsl.sweeps.ray_backend", "extend": "fedsl.sweeps.extend",
    "assess": "fedsl.assess", "tune": "fedsl.tune",
}

alias_moved(__name__, MOVED)
