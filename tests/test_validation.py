"""The validation split (``data.validation``): samples set aside from the clients, evaluated beside the test set,
never trained on; recorded in metrics.csv and summary.json, restored on resume, and absent (nothing changed) at 0."""

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsl.config import expand as sweep
from fedsl.config import loading, presets
from fedsl.config.schema import ConfigError, validate
from fedsl.data.clients import ClientIndex
from fedsl.data.datasets import build_federation, hold_out_validation, load_arrays
from fedsl.data.partition import PartitionError
from fedsl.runs import callbacks
from fedsl.runs.build import prepare
from fedsl.runs.results import METRIC_COLUMNS, VALIDATION_COLUMNS, RunDir
from fedsl.runs.runner import run, run_stacked

# the quickstart preset at a tiny size: 400 training samples, N = 20 clients of n_i = 20, |D0| = 100 (IID, drawn
# from the whole pool, so overlapping the clients'); B = 10 so that a client left with 15 samples still has a batch
TINY = ["rounds=3", "threads=1", "data.train_per_class=40", "data.test_per_class=5", "algorithm.batch_size=10"]


def config(*sets: str, variant: str = "FSL"):
    cfg = loading.load(base=presets.load("quickstart"), overrides=[*TINY, *sets])
    return sweep.expand_variants(cfg)[variant]


def federation(*sets: str):
    c = config(*sets)
    return build_federation(c.data, c.seed)


def index_digest(fed) -> str:
    """The federation's index arrays and labels (which a partition decides; the pixels are the font renderer's)."""
    h = hashlib.sha256()
    for a in (fed.y.numpy(), fed.clients.offsets, fed.clients.indices, fed.server, fed.y_test.numpy(), fed.unlabelled):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def rows(folder: Path) -> list[dict]:
    with open(folder / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def quiet(_msg: str) -> None:
    pass


# ------------------------------------------------------------------ the split


def test_each_client_gives_floor_f_n_i_samples_disjoint_from_its_training_d0_and_test():
    whole, fed = federation(), federation("data.validation=0.25")
    val = fed.validation
    assert val.dtype == np.int64 and len(val) == 20 * 5 == len(np.unique(val))  # ⌊0.25·20⌋ = 5 from each client
    assert fed.clients.own_sizes.tolist() == [15] * 20 and fed.n == 300
    for i in range(20):
        before, after = set(whole.clients[i].tolist()), set(fed.clients[i].tolist())
        given = before - after
        assert after <= before and len(given) == 5 and given <= set(val.tolist())  # client i's own 5
        assert fed.clients[i].tolist() == [j for j in whole.clients[i].tolist() if j in after]  # order kept
    assert not np.intersect1d(val, fed.clients.indices).size
    assert not np.intersect1d(val, fed.server).size and not np.intersect1d(val, fed.unlabelled).size
    # D0 (overlapping the clients, as in the paper), U, the pool and the test set are the federation's without it
    assert np.array_equal(fed.server, whole.server) and np.array_equal(fed.unlabelled, whole.unlabelled)
    assert torch.equal(fed.x, whole.x) and torch.equal(fed.y, whole.y)
    assert torch.equal(fed.x_test, whole.x_test) and torch.equal(fed.y_test, whole.y_test)
    on_cpu = fed.to(torch.device("cpu"), torch.float64)
    assert np.array_equal(on_cpu.validation, val)  # carried by Federation.to


def test_without_the_key_or_at_zero_the_federation_is_the_one_built_before_the_split_existed():
    # the digests are those of the code before data.validation (committed results depend on them)
    for sets, digest in (((), "0337f6dd95cef2fc"), (("data.partition=dirichlet",), "1da0f503f623dffc"),
                         (("data.server_source=clients", "data.server_samples_per_client=5", "data.server_size=0"),
                          "c625a585f91ae8a1")):
        without, zero = federation(*sets), federation(*sets, "data.validation=0")
        assert index_digest(without) == index_digest(zero) == digest
        for name in ("server", "unlabelled", "validation"):
            assert np.array_equal(getattr(without, name), getattr(zero, name))
        assert np.array_equal(without.clients.offsets, zero.clients.offsets)
        assert np.array_equal(without.clients.indices, zero.clients.indices)
        for name in ("x", "y", "x_test", "y_test"):
            assert torch.equal(getattr(without, name), getattr(zero, name))
        assert zero.validation.dtype == np.int64 and len(zero.validation) == 0


def test_same_seed_same_split_other_seed_other_split():
    a, b = federation("data.validation=0.25"), federation("data.validation=0.25")
    assert np.array_equal(a.validation, b.validation) and np.array_equal(a.clients.indices, b.clients.indices)
    # another seed: another partition, D0 and split; the split alone differs too (held fixed: the clients)
    other = federation("data.validation=0.25", "seed=1")
    assert not np.array_equal(a.validation, other.validation)
    clients = ClientIndex.from_arrays([np.arange(10 * i, 10 * i + 10) for i in range(8)])
    s0 = hold_out_validation(clients, 0.3, 0, np.zeros(0, dtype=np.int64))[1]
    s1 = hold_out_validation(clients, 0.3, 1, np.zeros(0, dtype=np.int64))[1]
    assert len(s0) == len(s1) == 24 and not np.array_equal(s0, s1)


def test_the_rule_floor_at_least_one_left_and_only_samples_outside_d0():
    clients = ClientIndex.from_arrays([np.array([0]), np.array([1, 2, 3, 4]), np.arange(5, 15), np.arange(15, 18)])
    exclude = np.array([1, 2, 3, 15, 16, 17])  # client 1 has one sample outside D0, client 3 none
    kept, val = hold_out_validation(clients, 0.75, 4, exclude)
    # k_i = ⌊0.75·n_i⌋ = 0, 3, 7, 2, capped by the samples outside D0 (1 and 0)
    assert kept.own_sizes.tolist() == [1, 3, 3, 3] and len(val) == 8
    assert val[0] == 4 and set(val[1:].tolist()) <= set(range(5, 15)) and not np.intersect1d(val, exclude).size
    assert np.array_equal(np.sort(np.concatenate([kept.indices, val])), np.arange(18))
    # f close to 1: every client keeps one sample
    kept, val = hold_out_validation(ClientIndex.from_arrays([np.arange(7), np.arange(7, 9)]), 0.999, 0,
                                    np.zeros(0, dtype=np.int64))
    assert kept.own_sizes.tolist() == [1, 1] and len(val) == 7


def test_a_natural_federation_splits_each_id_and_ds_trains_on_the_rest_and_d0(tmp_path):
    from test_natural import TEST, TRAIN, write_leaf
    root = write_leaf(tmp_path / "femnist", TRAIN, TEST)
    data = {"dataset": "leaf", "data_dir": str(root), "partition": "natural", "num_clients": 5, "server_size": 8,
            "server_overlap": False}  # D0 first, out of the ids' samples; then the split of what they keep
    whole = build_federation(validate({"rounds": 2, "data": data, "algorithm": {"name": "ds"}}).data, 0)
    cfg = validate({"rounds": 2, "data": {**data, "validation": 0.5}, "model": {"name": "mlp"},
                    "algorithm": {"name": "ds", "clients_per_round": 2, "batch_size": 1}})
    fed = build_federation(cfg.data, 0)
    n = whole.clients.own_sizes
    assert fed.clients.own_sizes.tolist() == (n - n // 2).tolist() and len(fed.validation) == int((n // 2).sum())
    owners = load_arrays(cfg.data).train.owners
    for i in range(5):  # an id's validation samples are its own: ⌊n_i/2⌋ of them
        assert int((owners[fed.validation] == i).sum()) == n[i] // 2
    summary = run(cfg, tmp_path / "ds", log=quiet, progress=False)
    assert summary["status"] == "completed" and summary["validation_size"] == len(fed.validation)
    sim = prepare(cfg).sim  # DS: D_i ∪ D0, never a validation sample
    for i in range(5):
        assert np.isin(fed.server, sim.client_data[i]).all()
        assert not np.isin(fed.validation, sim.client_data[i]).any()


def test_a_fraction_that_sets_nothing_aside_stops_in_one_line():
    with pytest.raises(PartitionError, match=r"data.validation = 0.01: sets aside no sample .*largest n_i is 20\)"):
        federation("data.validation=0.01")


@pytest.mark.parametrize("sets, message", [
    (("data.validation=1",), "data.validation"),
    (("data.validation=-0.1",), "data.validation"),
])
def test_bad_values_stop_in_one_line(sets, message):
    with pytest.raises(ConfigError) as e:
        loading.load(base={"rounds": 1, "data": {"dataset": "synthetic_chars"}, "algorithm": {"name": "fedavg"}},
                     overrides=list(sets))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dataset", ["synthetic_leaf", "synthetic_fedprox"])
def test_a_generated_federation_sets_aside_a_share_of_each_client_and_pools_that_of_its_validation_clients(dataset):
    """Clients made on demand: each trains on t_k − ⌊f·t_k⌋ of its t_k = ⌊0.9·n_k⌋ samples; the share set aside of
    ``synthetic_test_clients`` clients (drawn from the seed) is made from a stream of its own and appended to the
    pool after D0. The test set, D0 and, with f = 0, the whole federation are as without the key."""
    from fedsl.data import generated

    base = {"rounds": 1, "data": {"dataset": dataset, "num_clients": 200, "server_size": 30,
                                  "synthetic_test_clients": 40}, "model": {"name": "logreg"},
            "algorithm": {"name": "fedavg", "batch_size": 2}}
    plain = build_federation(loading.load(base=base).data, 0)
    assert len(plain.validation) == 0
    fed = build_federation(loading.load(base=base, overrides=["data.validation=0.2"]).data, 0)
    t = plain.clients.own_sizes
    assert (fed.clients.own_sizes == t - np.minimum((0.2 * t).astype(np.int64), t - 1)).all()
    assert torch.equal(fed.x_test, plain.x_test) and torch.equal(fed.x[fed.server], plain.x[plain.server])
    assert (fed.validation == 30 + np.arange(len(fed.validation))).all() and len(fed.x) == 30 + len(fed.validation)
    held = generated.validation_sizes(t, 0.2)
    assert 0 < len(fed.validation) <= np.sort(held)[-40:].sum()  # the share of 40 clients at most
    again = build_federation(loading.load(base=base, overrides=["data.validation=0.2"]).data, 0)
    assert torch.equal(again.x, fed.x) and (again.validation == fed.validation).all()
    big = np.argsort(t)[-2:].tolist()  # the largest clients: they set aside ⌊0.2·t_k⌋ > 0
    x_new, _ = fed.on_demand.samples(big)  # a client's training samples: the first of its stream, fewer now
    x_old, _ = plain.on_demand.samples(big)
    assert len(x_new) == fed.clients.sizes_of(big).sum() < len(x_old)
    assert np.array_equal(x_new[:10], x_old[:10])  # the same stream, cut shorter


def test_a_flower_run_refuses_a_validation_set_in_one_line():
    pytest.importorskip("flwr")
    from fedsl.flower.config import parse_run_config
    with pytest.raises(ConfigError, match="data.validation = 0.2: a validation set is evaluated by `fedsl run`") as e:
        parse_run_config({"preset": "quickstart", "variant": "FSL", "data.validation": 0.2})
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ evaluation


def test_evaluate_validation_measures_the_validation_samples_as_evaluate_measures_the_test_set():
    prep = prepare(config("data.validation=0.25"))
    sim = prep.sim
    assert sim.channels_last  # the CPU's channels-last pool: the gathered samples keep the model's layout
    x = sim.initial_state().x
    acc, loss = sim.evaluate_validation(x)
    idx = torch.from_numpy(prep.fed.validation)
    sim.fm.train(False)
    with torch.no_grad():
        logits = sim.fm.forward(x, prep.fed.x[idx])
    y = prep.fed.y[idx]
    assert acc == (logits.argmax(1) == y).double().mean().item()
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    assert sim.evaluate_validation(x) == (acc, loss)  # gathered once, read again
    assert prepare(config()).sim.evaluate_validation(x) is None


# ------------------------------------------------------------------ records


class Scores(callbacks.Callback):
    def __init__(self) -> None:
        self.seen: dict[int, dict] = {}

    def on_evaluation(self, round: int, metrics: dict) -> None:
        self.seen[round] = dict(metrics)


def test_metrics_summary_and_callbacks_gain_the_validation_scores(tmp_path):
    scores = Scores()
    summary = run(config("data.validation=0.25", "rolling_window=2"), tmp_path / "v", log=quiet, progress=False,
                  callbacks=[scores])
    r = rows(tmp_path / "v")
    assert list(r[0]) == METRIC_COLUMNS + VALIDATION_COLUMNS and [int(x["round"]) for x in r] == [0, 1, 2, 3]
    val = [float(x["val_accuracy"]) for x in r]
    assert all(x["val_loss"] for x in r) and all(0 <= v <= 1 for v in val)
    # round 0: its own value; then the mean over the window of 2 rounds (round 0 outside it, as for the test's)
    assert [float(x["rolling_val_accuracy"]) for x in r] == [val[0], val[1], (val[1] + val[2]) / 2,
                                                             (val[2] + val[3]) / 2]
    assert summary["final_val_accuracy"] == (val[2] + val[3]) / 2 and summary["validation_size"] == 100
    assert json.loads((tmp_path / "v" / "summary.json").read_text())["final_val_accuracy"] == summary[
        "final_val_accuracy"]
    assert sorted(scores.seen) == [0, 1, 2, 3]
    for t, x in enumerate(r):
        for k in VALIDATION_COLUMNS:
            assert scores.seen[t][k] == float(x[k])  # what a tuner's pruning reads, as written

    plain = run(config(), tmp_path / "p", log=quiet, progress=False)  # without: as before the key existed
    assert list(rows(tmp_path / "p")[0]) == METRIC_COLUMNS
    assert not {"final_val_accuracy", "validation_size"} & set(plain)


def test_a_resumed_run_records_what_an_uninterrupted_one_does(tmp_path):
    cfg = config("data.validation=0.25", "rolling_window=2", "rounds=4")
    whole = run(cfg, tmp_path / "whole", log=quiet, progress=False)
    assert run(cfg, tmp_path / "cut", log=quiet, progress=False, stop_after=2)["status"] == "interrupted"
    assert RunDir(tmp_path / "cut").checkpoint_round() == 2
    resumed = run(cfg, tmp_path / "cut", log=quiet, progress=False, resume=True)
    keep = [c for c in METRIC_COLUMNS + VALIDATION_COLUMNS if c != "wall_time"]
    assert [[x[c] for c in keep] for x in rows(tmp_path / "cut")] == [[x[c] for c in keep]
                                                                      for x in rows(tmp_path / "whole")]
    assert resumed["final_val_accuracy"] == whole["final_val_accuracy"]
    assert resumed["final_accuracy"] == whole["final_accuracy"]


def test_stacked_runs_record_the_validation_scores_of_runs_one_by_one(tmp_path):
    cfgs = [config("data.validation=0.25", f"seed={s}") for s in (0, 1)]
    stacked = run_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"], log=quiet)
    for s, cfg in enumerate(cfgs):
        alone = run(cfg, tmp_path / f"a{s}", log=quiet, progress=False)
        cols = ["round", "accuracy", *VALIDATION_COLUMNS]
        assert [[x[c] for c in cols] for x in rows(tmp_path / f"s{s}")] == [[x[c] for c in cols]
                                                                           for x in rows(tmp_path / f"a{s}")]
        assert stacked[s]["final_val_accuracy"] == alone["final_val_accuracy"]


def test_evaluating_the_validation_set_changes_nothing_the_run_trains(tmp_path):
    # one split, evaluated every round or every other round (the final window off, so the rounds differ): the
    # models after T rounds are equal bit for bit
    every = config("data.validation=0.25", "rounds=4", "eval_final_window=false")
    sparse = config("data.validation=0.25", "rounds=4", "eval_final_window=false", "eval_every=2")
    run(every, tmp_path / "every", log=quiet, progress=False)
    run(sparse, tmp_path / "sparse", log=quiet, progress=False)
    assert [x["round"] for x in rows(tmp_path / "every")] == ["0", "1", "2", "3", "4"]
    assert [x["round"] for x in rows(tmp_path / "sparse")] == ["0", "2", "4"]
    ca, cb = RunDir(tmp_path / "every").load_checkpoint(), RunDir(tmp_path / "sparse").load_checkpoint()
    assert ca.round == cb.round == 4
    a, b = ca.state.x, cb.state.x
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
