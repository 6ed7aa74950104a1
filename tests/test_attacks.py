"""Byzantine clients (fedsl.core.attacks, fedsl.data.poisoning; the [attack] table).

The malicious set is ⌊f·N⌋ clients drawn once from the seed; each model-update attack is checked by hand on
tiny tensors; label flipping relabels the malicious clients' own samples only (never D0's, another client's or
the test set's, even where D0 holds the same samples); the engine attacks exactly the malicious sampled clients'
models, after their honest training; a run records its malicious clients; an attacked run resumes bit for bit;
bad values are one-line errors; a Flower run refuses an attack.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import random_federation, tiny_config

from fedsl.algorithms import LocalTraining, make_algorithm
from fedsl.config import schema as C
from fedsl.core import attacks, rng
from fedsl.core.attacks import Attack, attack_finals, attacked_update, malicious_clients, malicious_count
from fedsl.data.federation import Federation
from fedsl.data.poisoning import flip_labels
from fedsl.engine.executors import SequentialExecutor
from fedsl.engine.functional import FunctionalModel
from fedsl.engine.simulator import Simulator
from fedsl.models import build_model
from fedsl.runs.runner import run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [9, 31, 17, 24, 12, 30, 16, 20, 11, 14]


# ----------------------------------------------------------------------------- who is malicious

def test_malicious_set_is_floor_f_n_clients_drawn_once_from_the_seed():
    a = Attack("sign_flip", 0.3)
    m = malicious_clients(5, 10, a)
    assert len(m) == 3 and list(m) == sorted(set(m.tolist())) and all(0 <= i < 10 for i in m)
    np.testing.assert_array_equal(m, np.sort(rng.rng(5, rng.ATTACKERS).choice(10, 3, replace=False)))
    np.testing.assert_array_equal(m, malicious_clients(5, 10, Attack("gaussian", 0.3)))  # the kind draws nothing
    assert any(not np.array_equal(m, malicious_clients(s, 10, a)) for s in range(6, 12))
    assert malicious_count(100, 0.29) == 29  # 0.29·100 = 28.999999999999996 in floats
    assert malicious_count(450, 0.1) == 45 and malicious_count(7, 0.2) == 1 and malicious_count(4, 0.2) == 0
    assert len(malicious_clients(5, 10, Attack("none", 0.5))) == 0  # no attack: nobody, nothing drawn


def test_attack_bounds():
    with pytest.raises(ValueError, match="fraction"):
        Attack("sign_flip", 1.0)
    with pytest.raises(ValueError, match="kind"):
        Attack("flip")


# ----------------------------------------------------------------------------- the attacks on updates

DELTA = {"w": torch.tensor([[1.0, -2.0], [0.5, 0.0]], dtype=torch.float64), "b": torch.tensor([3.0, -1.0],
                                                                                             dtype=torch.float64)}


def test_sign_flip_scale_and_constant_by_hand():
    flip = attacked_update(Attack("sign_flip", 0.2), DELTA, 0, 0, 0)
    assert torch.equal(flip["w"], torch.tensor([[-1.0, 2.0], [-0.5, 0.0]], dtype=torch.float64))
    assert torch.equal(flip["b"], torch.tensor([-3.0, 1.0], dtype=torch.float64))
    flip3 = attacked_update(Attack("sign_flip", 0.2, scale=3.0), DELTA, 0, 0, 0)
    assert torch.equal(flip3["b"], torch.tensor([-9.0, 3.0], dtype=torch.float64))
    boost = attacked_update(Attack("scale", 0.2), DELTA, 0, 0, 0)  # default λ = 10
    assert torch.equal(boost["w"], torch.tensor([[10.0, -20.0], [5.0, 0.0]], dtype=torch.float64))
    assert torch.equal(attacked_update(Attack("scale", 0.2, scale=0.5), DELTA, 0, 0, 0)["b"],
                       torch.tensor([1.5, -0.5], dtype=torch.float64))
    const = attacked_update(Attack("constant", 0.2, constant=-0.25), DELTA, 0, 0, 0)
    assert torch.equal(const["w"], torch.full((2, 2), -0.25, dtype=torch.float64))
    assert torch.equal(const["b"], torch.full((2,), -0.25, dtype=torch.float64))


def test_gaussian_update_is_drawn_from_seed_round_and_client():
    a = Attack("gaussian", 0.2, noise_std=0.5)
    got = attacked_update(a, DELTA, 7, 3, 4)
    gen = rng.rng(7, 3, rng.ATTACK_NOISE, 4)
    b = gen.standard_normal((2,))  # sorted names: "b" before "w"
    w = gen.standard_normal((2, 2))
    assert torch.equal(got["b"], torch.from_numpy(0.5 * b)) and torch.equal(got["w"], torch.from_numpy(0.5 * w))
    assert list(got) == list(DELTA)
    again = attacked_update(a, DELTA, 7, 3, 4)
    assert all(torch.equal(got[n], again[n]) for n in got)
    for other in (attacked_update(a, DELTA, 7, 4, 4), attacked_update(a, DELTA, 7, 3, 5)):  # another round, client
        assert not torch.equal(got["w"], other["w"])
    f32 = attacked_update(a, {n: v.float() for n, v in DELTA.items()}, 7, 3, 4)
    assert f32["w"].dtype == torch.float32 and torch.equal(f32["w"], got["w"].float())


def test_attack_finals_replaces_the_malicious_rows_only():
    x = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    finals = {"w": torch.tensor([[1.5, 2.5], [0.0, 0.0], [2.0, 1.0]], dtype=torch.float64)}
    ids = (2, 5, 8)
    out = attack_finals(Attack("sign_flip", 0.3, scale=2.0), x, finals, ids, np.array([1, 5, 8]), 0, 0)
    assert torch.equal(out["w"][0], finals["w"][0])  # client 2 is honest
    assert torch.equal(out["w"][1], torch.tensor([3.0, 6.0], dtype=torch.float64))  # x − 2·(x_5 − x)
    assert torch.equal(out["w"][2], torch.tensor([-1.0, 4.0], dtype=torch.float64))  # x − 2·(x_8 − x)
    assert torch.equal(finals["w"][1], torch.zeros(2, dtype=torch.float64))  # the input is not written
    # nobody malicious among the sampled, or a data-poisoning attack: the very same models
    assert attack_finals(Attack("sign_flip", 0.3), x, finals, ids, np.array([0, 1]), 0, 0) is finals
    assert attack_finals(Attack("label_flip", 0.3), x, finals, ids, np.array([5]), 0, 0) is finals


# ----------------------------------------------------------------------------- label flipping

def _overlapping_federation() -> Federation:
    """Random federation whose D0 holds two of client 1's samples (an iid D0 drawn from the whole pool)."""
    fed = random_federation([5, 6, 4], n0=4, num_classes=4)
    return Federation(fed.x, fed.y, fed.clients, np.concatenate([fed.server, fed.clients[1][:2]]), fed.x_test,
                      fed.y_test, fed.num_classes, fed.class_names)


def test_label_flip_relabels_the_malicious_clients_own_samples_only():
    fed = _overlapping_federation()
    y0, x0 = fed.y.clone(), fed.x.clone()
    out = flip_labels(fed, [1])
    assert torch.equal(fed.y, y0) and torch.equal(fed.x, x0) and out is not fed  # the input is unchanged
    old, new = fed.clients[1], out.clients[1]
    assert len(new) == len(old) and new.min() >= len(fed.x)
    assert torch.equal(out.x[torch.as_tensor(new)], fed.x[torch.as_tensor(old)])  # same samples, same order
    assert torch.equal(out.y[torch.as_tensor(new)], 3 - fed.y[torch.as_tensor(old)])  # y → L − 1 − y
    for i in (0, 2):  # the honest clients
        assert np.array_equal(out.clients[i], fed.clients[i])
    assert np.array_equal(out.server, fed.server)  # D0, including the two samples it shares with client 1
    assert torch.equal(out.y[torch.as_tensor(out.server)], fed.y[torch.as_tensor(fed.server)])
    assert torch.equal(out.y[: len(fed.y)], fed.y) and torch.equal(out.y_test, fed.y_test)
    assert flip_labels(fed, []) is fed


def _sim(fed, attack, name="fedavg", s=4, seed=11):
    fm = FunctionalModel(build_model("mlp", fed.num_classes, fed.input_shape, seed=3).to(fed.x.dtype))
    alg = make_algorithm(name, LocalTraining(0.1, 4), 1.0, None)
    return Simulator(fm, fed, alg, SequentialExecutor(fm), s, seed=seed, attack=attack)


def test_label_flip_with_data_sharing_keeps_d0_honest():
    """DS: a malicious client trains on D_i ∪ D0; its own part is flipped, D0's part is not."""
    fed = random_federation(SIZES, n0=6)
    sim = _sim(fed, Attack("label_flip", 0.3), name="ds")
    assert len(sim.malicious) == 3
    for i in range(len(SIZES)):
        data = sim.client_data[i]
        own, shared = torch.as_tensor(data[:SIZES[i]]), torch.as_tensor(data[SIZES[i]:])
        orig = torch.as_tensor(fed.clients[i])
        assert torch.equal(sim.fed.x[own], fed.x[orig])
        flip = i in sim.malicious
        assert torch.equal(sim.fed.y[own], 3 - fed.y[orig] if flip else fed.y[orig]), i
        assert torch.equal(sim.fed.y[shared], fed.y[torch.as_tensor(fed.server)])


# ----------------------------------------------------------------------------- in the engine

def test_the_engine_attacks_the_malicious_sampled_clients_after_honest_training():
    fed = random_federation(SIZES)
    attack = Attack("sign_flip", 0.4, scale=2.0)
    bad, honest = _sim(fed, attack), _sim(fed, Attack())
    st = honest.initial_state()
    hits = 0
    for t in range(4):
        work = honest.sample(t)
        finals, _ = honest.train_clients(st, work, t)
        clean = honest.results(work, finals, st.x, t)
        dirty = bad.results(work, finals, st.x, t)
        assert clean.params is finals  # no attack: the models as trained
        for j, i in enumerate(clean.ids):
            for n, p in st.x.items():
                want = p - 2.0 * (finals[n][j] - p) if i in bad.malicious else finals[n][j]
                assert torch.equal(dirty.params[n][j], want), (t, i, n)
            hits += i in bad.malicious
        st, _ = honest.round(st, t)
    assert hits  # some malicious client was sampled


def test_an_attacked_run_records_its_malicious_clients_and_resumes_bit_for_bit(tmp_path):
    """Gaussian updates (drawn from the round) against FLTrust (its g0 from the round's D0 batches) with server
    learning after it: an interrupted and resumed run equals the uninterrupted one."""
    cfg = C.validate(tiny_config(rounds=6, attack={"kind": "gaussian", "fraction": 0.4, "noise_std": 0.1},
                                 robust={"aggregator": "fltrust"}))
    whole = run(cfg, tmp_path / "whole", log=lambda m: None, progress=False)
    assert whole["attack"] == {"kind": "gaussian", "fraction": 0.4, "malicious_count": 2,
                               "malicious": malicious_clients(3, 6, cfg.byzantine).tolist()}
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["attack"] == whole["attack"]
    part = run(cfg, tmp_path / "part", log=lambda m: None, progress=False, stop_after=4)
    assert part["status"] == "interrupted"
    done = run(cfg, tmp_path / "part", resume=True, log=lambda m: None, progress=False)
    assert done["status"] == "completed" and done["final_accuracy"] == whole["final_accuracy"]
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["params"]
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["params"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert _scores(tmp_path / "whole") == _scores(tmp_path / "part")


def _scores(run_dir) -> list[list[str]]:
    with open(run_dir / "metrics.csv") as f:
        return [[r[c] for c in ("round", "accuracy", "loss", "rolling_accuracy")] for r in csv.DictReader(f)]


def test_a_run_without_an_attack_draws_nothing_new_and_records_nothing(tmp_path, monkeypatch):
    drawn = []
    real = rng.rng
    monkeypatch.setattr(rng, "rng", lambda seed, *s: drawn.append(s) or real(seed, *s))
    cfg = C.validate(tiny_config(rounds=2, attack={"kind": "none"}))  # with a fraction: refused (test_config.py)
    s = run(cfg, tmp_path / "r", log=lambda m: None, progress=False)
    assert "attack" not in s
    new = {rng.ATTACKERS, rng.ATTACK_NOISE, rng.ROOT_BATCHES}
    assert not [d for d in drawn if new & set(d[:3])]



def test_at_fraction_zero_every_attack_is_the_run_without_one(tmp_path):
    """f = 0: nobody is malicious, so sign and label flipping give the no-attack run's scores and model bit for bit
    (robustness-emnist runs label flipping at f > 0 only, and takes sign flipping's f = 0 runs as both)."""
    scores, models = {}, {}
    for kind in ("none", "sign_flip", "label_flip"):
        cfg = C.validate(tiny_config(rounds=3, attack={"kind": kind, "fraction": 0.0}, robust={"aggregator": "median"}))
        run(cfg, tmp_path / kind, log=lambda m: None, progress=False)
        scores[kind] = _scores(tmp_path / kind)
        models[kind] = torch.load(tmp_path / kind / "checkpoint.pt", weights_only=True)["params"]
    assert scores["sign_flip"] == scores["label_flip"] == scores["none"]
    assert all(torch.equal(models["label_flip"][n], models["none"][n]) for n in models["none"])
    assert all(torch.equal(models["sign_flip"][n], models["none"][n]) for n in models["none"])

# ----------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("attack,fragment", [
    ({"fraction": 1.0}, "attack.fraction = 1.0"),
    ({"kind": "flip"}, "attack.kind = 'flip'"),
    ({"kind": "scale", "scale": 0}, "attack.scale = 0"),
    ({"kind": "gaussian", "noise_std": -1.0}, "attack.noise_std = -1.0"),
    ({"kinds": "scale"}, "unknown key 'attack.kinds'"),
])
def test_bad_attack_values_are_one_line(attack, fragment):
    with pytest.raises(C.ConfigError) as info:
        C.validate(tiny_config(attack=attack))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_flower_refuses_an_attack():
    from fedsl.flower.config import parse_run_config
    with pytest.raises(C.ConfigError, match="attack.kind = 'sign_flip'") as info:
        parse_run_config({"preset": "quickstart", "attack.kind": "sign_flip", "attack.fraction": 0.2,
                          "variant": "FSL"})
    assert "\n" not in str(info.value)


def test_stream_constants_are_new():
    assert len({rng.ATTACKERS, rng.ATTACK_NOISE, rng.ROOT_BATCHES}) == 3
    assert attacks.UPDATE_KINDS == ("sign_flip", "scale", "gaussian", "constant")
