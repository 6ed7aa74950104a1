"""Many runs from one config (its runs, one config each: ``fedsl.config.expand``): run as a group with its
group.json (``compare``), side by side in processes (``parallel``) or on a Ray cluster (``ray_backend``), and a
finished run or group taken on to more rounds (``extend``).

It may import ``runs``, ``config`` and everything below them.
"""
