"""The config: what a run, a group or a study is, in keys a researcher writes (TOML, ``--set``, a preset), checked
before anything runs.

- ``schema``: the ``RunConfig`` and its validation (one-line ``ConfigError`` naming the key, the value, what is
  expected), built from ``base`` (the error, strict tables), ``tables`` (a table per part: algorithm, server,
  model, ...) and ``data_keys`` (the [data] table);
- ``own_keys``: the keys a rule, a dataset or an attack reads, so that an unread key is refused;
- ``loading``: a file or a preset's dict, its ``quick`` table and ``--set`` overrides, into a ``RunConfig``;
  ``expand``: a config's variants, sweep points and seeds expanded into one validated config per run, and the dotted
  keys over nested dicts that expanding and loading share; ``presets``: the paper's experiments as TOML files
  (``presets/``);
- ``resolve``: the defaults that depend on other keys (η_g = √S for the rules that say so, ...);
- ``tune_space``, ``tune_storage``: the [tune] table's search spaces and where studies live.

It may import ``core``, ``data``, ``models``, ``algorithms`` and ``engine`` (the rules' specs and the executors'
names a key is checked against), nothing above.
"""
