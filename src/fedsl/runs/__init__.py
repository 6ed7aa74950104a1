"""A run: built from its config, driven round by round, kept in its folder, stopped and resumed.

- ``build``: the simulator (data, model, algorithm, executor) a config describes; ``placement`` and ``memory``:
  where it runs and how many runs fit together on a device;
- ``runner``: drives a run (or a stack of runs) to its end, evaluating, checkpointing and writing as it goes;
  ``callbacks``, ``progress``, ``tracking`` (TensorBoard, MLflow), ``divergence`` and ``interrupts`` (Ctrl-C,
  SIGTERM) are what it calls along the way;
- ``results``, ``files``, ``checkpoint``, ``status``: the run folder (config.json, metrics.csv, summary.json,
  checkpoint.pt) and reading it back;
- ``record``: a ``Simulator`` built in Python kept in the same folder as a run of ``fedsl run``.

It may import ``config`` and everything below it, nothing that drives many runs (``sweeps``, ``tune``).
"""
