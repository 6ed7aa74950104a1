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
TOY = 10  # the images of data.dataset = 'toy' (fedsl.sources.toy)
AVAILABILITY = 11  # which clients are available in a round (algorithm.availability_pattern = 'bernoulli')
AVAILABILITY_PHASE = 12  # each client's phase in its fixed availability cycle (pattern 'fixed'), drawn once
SAMPLE_AVAILABLE = 13  # S of the round's available clients (algorithm.availability < 1)
STRAGGLERS = 14  # which sampled clients straggle, and how many of their K_i steps a partial one does
SAMPLE_NODES = 19  # S of the connected nodes of a round (a Flower run with federation = 'open')
# 16-18: FedDF's unlabelled data and distillation; 20 onwards: Byzantine clients and robust rules (15: DP's noise)
DISTILL_BATCHES = 16  # the batches of the unlabelled data U (and dropout keys) of FedDF's distillation in round t
DISTILL_SPLIT = 17  # which samples of U are held out for the distillation's early stopping, drawn once
UNLABELLED = 18  # which images of an unlabelled source make U (data.unlabelled_size), drawn once
ATTACKERS = 20  # which ⌊f·N⌋ clients are malicious for the whole run (attack.fraction), drawn once
ATTACK_NOISE = 21  # a malicious client's Gaussian update in round t (attack.kind = 'gaussian')
ROOT_BATCHES = 22  # the batches of D0 behind FLTrust's server update g0 in round t (robust.aggregator = 'fltrust')
BUCKETS = 23  # the order of round t's updates before they are averaged in buckets (robust.bucket > 1)
DP_NOISE = 15  # the Gaussian noise of round t's private aggregate (privacy.clip: DP-FedAvg)
DP_COUNT_NOISE = 24  # the noise on round t's count of unclipped updates (privacy.adaptive: adaptive clipping)
NATURAL_HELD_OUT = 30  # which of each id's samples are its test samples (data.dataset = 'hf_files', no test split)
VALIDATION = 31  # which of each client's samples make the validation set (data.validation), drawn once
BATCHNORM_SAMPLE = 32  # the samples of BatchNorm's evaluation statistics ('clients'), FedBN's clients ('local')
# 25-28: Synthetic(α, β) (fedsl.data.synthetic_fedprox); D0's picks there use SERVER_DATA as every D0 does
SYNTHETIC_SIZES = 25  # n_k of every client of Synthetic(α, β), drawn once (client k's is the k-th draw, for any N)
SYNTHETIC_CLIENT = 26  # client k's model (u_k, B_k, v_k, W_k, b_k), then its samples: rng(seed, SYNTHETIC_CLIENT, k)
SYNTHETIC_TEST = 27  # which clients' held-out samples make the test set (more clients than data.synthetic_test_clients)
SYNTHETIC_SERVER = 28  # D0's fresh samples of device k (data.server_source = 'iid'): rng(seed, SYNTHETIC_SERVER, k)
# LEAF's synthetic data (fedsl.data.synthetic_leaf) reads 25-28 as Synthetic(α, β) does, and one stream more:
SYNTHETIC_SHARED = 29  # the model every client's is built from (Q, the clusters' centres), drawn once

# Seed offsets, for generators that take one integer seed rather than a stream tuple
# (``data.synthetic.make_font_chars``): ``offset_seed(seed, FONT_TEST)``. Fixed numbers too:
# they define which font images a seed draws.
FONT_TEST = 10_007    # synthetic_chars' test split (its training split uses the seed itself)
FONT_SERVER = 20_011  # data.server_dataset = 'synthetic_chars': D0 drawn from the run's seed


def rng(seed: int, *stream: int) -> np.random.Generator:
    """A numpy Generator for (seed, *stream); e.g. ``rng(seed, round, CLIENT_BATCHES, client)``."""
    # SeedSequence takes non-negative ints only: map negatives (round -1 = pretraining,
    # id -1 = server) to distinct large ones.
    entropy = [int(v) % 2**64 for v in (seed, *stream)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


# Draws keyed without a stream id, older than the ids above and kept as they are (an id would
# change every image they pick or render); ``np.random.default_rng([seed, label])`` is the same
# generator as ``rng(seed, label)``, and ``default_rng(seed)`` as ``rng(seed)``.


def per_label(seed: int, label: int) -> np.random.Generator:
    """The draw for one class ``label`` (value as stored in the files): which images ``carve_emnist`` and
    ``per_class_subset`` keep. One generator per class, so a class's pick does not depend on the others."""
    return rng(seed, label)


def font_images(seed: int) -> np.random.Generator:
    """Every random choice of ``make_font_chars`` (font, rotation, size, shift, stroke, elastic warp)."""
    return rng(seed)


def offset_seed(seed: int, offset: int) -> int:
    """The integer seed of the named stream ``offset`` (``FONT_TEST``, ``FONT_SERVER``) of ``seed``."""
    return seed + offset


def sample_clients(seed: int, round_: int, num_clients: int, per_round: int) -> np.ndarray:
    """S of N client ids, without replacement, sorted (order does not change the mean)."""
    chosen = rng(seed, round_, SAMPLE_CLIENTS).choice(num_clients, size=per_round, replace=False)
    return np.sort(chosen)


def sample_nodes(seed: int, round_: int, nodes: list[int], per_round: int) -> list[int]:
    """min(S, len(nodes)) of the connected node ids, without replacement, sorted; the draw depends on the
    sorted ids, not the order the SuperLink lists them in."""
    ordered = sorted(nodes)
    if per_round >= len(ordered):
        return ordered
    chosen = rng(seed, round_, SAMPLE_NODES).choice(len(ordered), size=per_round, replace=False)
    return sorted(ordered[int(i)] for i in chosen)
