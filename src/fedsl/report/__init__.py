"""Reports of finished runs and groups: ``tables`` (index.csv, the per-run and per-variant tables), ``plots``
(curves), ``grid`` (a sweep's grid), ``verdicts`` (the paper's claims judged over seeds, Holm over a group),
``summary`` (the record's computed blocks) and ``report`` (report.md beside the figures).

It reads run folders and configs: it may import ``sweeps``, ``runs``, ``config`` and everything below them; it
never drives a run.
"""
