"""The engine: rounds of Algorithm 1 over a federation, the same numbers whichever way they are computed.

- ``simulator``: a run's rounds (sample S clients, their LocalSGD, the server's rule and line 10 on D0), evaluation;
  ``stacked``: many runs that share a model and a federation advanced as one (``torch.func.vmap`` over runs);
- ``executors``, ``sequential``, ``pool``, ``per_client``: where the clients' updates are computed (one after
  another, vectorised over clients, in processes), each equal to the others;
- ``plan``: the batch plans, functions of (seed, round, client); ``functional``: a model as a pure function of its
  parameters; ``client_state``: the clients' states (dense tables or a sparse store, in memory or on disk);
- ``metrics`` and ``diagnostics``: what a run measures (accuracy, loss, T_0.5, ξ², G², the angle).

It may import ``core``, ``sources``, ``data``, ``models`` and ``algorithms``, nothing that reads a config.
"""
