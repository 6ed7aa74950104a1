"""All randomness of a run derives from (seed, round, stream, id).

A resumed run only needs the round number to redraw exactly what an uninterrupted run
would have drawn; no generator state is checkpointed. numpy's SeedSequence hashes the
tuple, so streams are independent and identical across platforms.
"""

from __future__ import annotations

import numpy as np

# Stream identifiers: fixed numbers, never reorder (they define what a seed means).
SAMPLE_CLIENTS = 1
CLIENT_BATCHES = 2
SERVER_BATCHES = 3
PRETRAIN = 4
DROPOUT = 100  # added to a batch stream to get its dropout-key stream
PARTITION = 6
SERVER_DATA = 7
TEST_SUBSET = 8
FINETUNE = 9  # the fine-tuning on D0 after the last round (server.finetune_epochs)


def rng(seed: int, *stream: int) -> np.random.Generator:
    """A numpy Generator for (seed, *stream); e.g. ``rng(seed, round, CLIENT_BATCHES, client)``."""
    # SeedSequence takes non-negative ints only: map negatives (round -1 = pretraining,
    # id -1 = server) to distinct large ones.
    entropy = [int(v) % 2**64 for v in (seed, *stream)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def sample_clients(seed: int, round_: int, num_clients: int, per_round: int) -> np.ndarray:
    """S of N client ids, without replacement, sorted (order does not change the mean)."""
    chosen = rng(seed, round_, SAMPLE_CLIENTS).choice(num_clients, size=per_round, replace=False)
    return np.sort(chosen)
