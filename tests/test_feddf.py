"""FedDF (``fedsl.algorithms.distillation``, ``feddf``): the server's ensemble distillation on unlabelled data.

A server step equals a hand-written plain-PyTorch distillation loop (nn.Module, torch.optim.Adam, CosineAnnealingLR,
clip_grad_norm_, F.kl_div); early stopping stops where its rule says and keeps the best validated model; FedDF +
server learning is the distillation then FSL's line 10; stacked runs equal runs one by one; STL-10's unlabelled
images are read from the publisher's file; bad configs stop with one line. All on font-rendered characters, an MLP,
a dozen unlabelled images. Flower = simulator: ``test_flower.py``.
"""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedsl.algorithms.distillation import Distillation, EarlyStopping, distill, validation_kl
from fedsl.algorithms.server_round import server_update
from fedsl.config import schema as config
from fedsl.config.expand import set_dotted
from fedsl.runs.build import prepare
from fedsl.sources.arrays import ImageSet

# FLOWER_RUN's federation (conftest): 4 clients of 4 font-rendered characters, D0 of 12 images (U: their images)
BASE = {"rounds": 2, "seed": 1, "dtype": "float64", "eval_every": 100, "threads": 1, "data.dataset": "synthetic_chars",
        "data.chars": "0123", "data.train_per_class": 30, "data.test_per_class": 10, "data.num_clients": 4,
        "data.classes_per_client": 2, "data.samples_per_client": 24, "data.server_size": 12, "model.name": "mlp",
        "algorithm.name": "feddf", "algorithm.clients_per_round": 3, "algorithm.local_lr": 0.05,
        "algorithm.batch_size": 10, "distill.steps": 6, "distill.batch_size": 4, "distill.eval_every": 2,
        "distill.patience": 2}


def make_config(**over) -> config.RunConfig:
    data: dict = {}
    for key, value in {**BASE, **{k.replace("__", "."): v for k, v in over.items()}}.items():
        set_dotted(data, key, value)
    return config.validate(data)


def first_round(sim):
    """Round 0's client half from x_0: (the state, the replies)."""
    state = sim.initial_state()
    work = sim.sample(0)
    finals, _ = sim.train_clients(state, work, 0)
    return state, sim.results(work, finals, state.x, 0)


def test_a_feddf_server_step_is_a_plain_pytorch_distillation_loop(one_thread):
    """x̄ = the clients' mean model, then K steps of Adam (cosine-annealed step size, gradient clipped) on
    KL(softmax(mean teacher logits / T) ‖ softmax(student logits / T)) over the engine's batches of U: written here
    with an nn.Module, torch.optim.Adam, CosineAnnealingLR, clip_grad_norm_ and F.kl_div."""
    lr, temperature, clip, steps = 0.02, 2.0, 0.3, 6
    cfg = make_config(distill__lr=lr, distill__temperature=temperature, distill__clip=clip, distill__val_fraction=0.0)
    sim = prepare(cfg).sim
    state, results = first_round(sim)
    new, metrics = server_update(sim.alg, state, results, 0, sim.server)
    assert metrics.distill_steps == steps and metrics.server_steps == 0

    def module(params):
        m = copy.deepcopy(sim.fm.module)
        m.load_state_dict(params)
        return m

    s = len(results.sizes)
    assert s == 3
    teachers = [module({n: v[i] for n, v in results.params.items()}).eval() for i in range(s)]
    student = module({n: results.params[n].mean(0) for n in state.x}).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    plan = sim.distill_plan(0)
    assert plan.idx.shape == (1, steps, 4) and bool((plan.weight == 0.25).all())  # 12 images, batches of 4
    norms = []
    for k in range(steps):
        xb = sim.fed.x[plan.idx[0, k]]
        with torch.no_grad():
            target = sum(t(xb) for t in teachers) / s
        loss = F.kl_div(F.log_softmax(student(xb) / temperature, dim=1), F.softmax(target / temperature, dim=1),
                        reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(student.parameters(), clip)))
        opt.step()
        sched.step()
    assert max(norms) > clip  # the clipping was exercised
    expected = dict(student.named_parameters())
    assert max((new.x[n] - expected[n]).abs().max().item() for n in new.x) < 1e-9  # float64; Adam divides by √v


def test_early_stopping_stops_where_the_rule_says_and_keeps_the_best_model(one_thread):
    rule = EarlyStopping(patience=3)
    seen = [rule.update(j, v) for j, v in ((2, 1.0), (4, 0.5), (6, 0.7), (8, 0.5), (10, 0.6))]
    assert seen == [(True, False), (True, False), (False, False), (False, True), (False, True)]  # 0.5 is no gain
    assert (rule.best, rule.best_step) == (0.5, 4)

    cfg = make_config(distill__lr=0.05, distill__steps=200, distill__val_fraction=0.25, distill__patience=6)
    sim = prepare(cfg).sim
    state, results = first_round(sim)
    d = sim.alg.distillation
    x_bar = {n: results.params[n].mean(0) for n in state.x}
    out = sim.distill(x_bar, results.params, 0)
    # the rule, written again: the first validation j with j - (step of the strictly best so far) >= patience
    best, best_step, stop = float("inf"), None, None
    for j, v in out.history:
        if v < best or best_step is None:
            best, best_step = min(best, v), j
        if j - best_step >= d.patience:
            stop = j
            break
    assert stop is not None and out.steps == stop < d.steps  # it stopped early, where the rule says
    assert [j for j, _ in out.history] == list(range(2, stop + 1, 2)) and out.best_step == best_step
    _, val = sim.unlabelled_parts()
    assert len(val) == 3
    targets = torch.stack([sim.fm.forward({n: v[i] for n, v in results.params.items()}, sim.fed.x[val])
                           for i in range(3)]).mean(0)
    sim.fm.train(False)
    kl = validation_kl(sim.fm.forward, out.x, sim.fed.x[val], targets, d.temperature, 100)
    assert kl == pytest.approx(best, rel=1e-9, abs=1e-15)  # the model returned is the best validated one


def test_feddf_with_server_learning_is_the_distillation_then_the_fsl_steps(one_thread):
    alone = prepare(make_config()).sim
    both = prepare(make_config(server__learning="incremental")).sim
    x_df, info_df = alone.round(alone.initial_state(), 0)
    x_sl, info_sl = both.round(both.initial_state(), 0)
    assert info_df.distill_steps == info_sl.distill_steps > 0 and info_df.server_steps == 0
    sl = both.alg.server_learning
    expected, k0 = both.server_sgd(x_df.x, 0, sl.gamma * sl.lr)  # line 10 on D0's labels, from the distilled x̄
    assert k0 == info_sl.server_steps > 0
    assert max((x_sl.x[n] - expected[n]).abs().max().item() for n in expected) == 0.0


def test_stacked_feddf_runs_equal_runs_one_by_one(one_thread):
    from fedsl.engine.stacked import StackedSimulator
    cfgs = [make_config(seed=1), make_config(seed=2, server__learning="incremental")]
    alone = []
    for c in cfgs:
        sim = prepare(c).sim
        st = sim.initial_state()
        for t in range(2):
            st, _ = sim.round(st, t)
        alone.append(st.x)
    stacked = StackedSimulator([prepare(c).sim for c in cfgs])
    states = stacked.initial_states()
    for t in range(2):
        states, infos = stacked.round(states, t)
    assert all(i.distill_steps > 0 for i in infos)
    for st, x in zip(states, alone):
        assert max((st.x[n] - x[n]).abs().max().item() for n in x) == 0.0


def test_unlabelled_data_from_another_source_is_appended_to_the_pool():
    from fedsl.data.datasets import build_federation
    cfg = make_config(data__server_size=0, data__unlabelled="synthetic_chars", data__unlabelled_size=10)
    fed = build_federation(cfg.data, cfg.seed)
    n_train = 4 * 30
    assert fed.n0 == 0 and len(fed.unlabelled) == 10 and (fed.unlabelled >= n_train).all()
    assert len(fed.y) > n_train and all(c.max() < n_train for c in fed.clients)
    default = build_federation(make_config().data, 1)
    assert np.array_equal(default.unlabelled, default.server)  # 'server': D0's images


def test_stl10_unlabelled_images_are_read_from_the_publishers_file(tmp_path, monkeypatch):
    from fedsl.core.errors import DataError
    from fedsl.data.datasets import unlabelled_subset
    from fedsl.sources import stl10
    monkeypatch.setenv("FEDSL_CACHE", str(tmp_path / "cache"))
    raw = np.random.default_rng(0).integers(0, 256, size=(5, stl10.IMAGE_BYTES), dtype=np.uint8)
    folder = tmp_path / "stl10" / stl10.FOLDER
    folder.mkdir(parents=True)
    raw.tofile(folder / stl10.UNLABELLED_FILE)
    train = ImageSet(np.zeros((2, 32, 32, 3), np.uint8), np.zeros(2, np.int64), ["a", "b"])
    d = types.SimpleNamespace(dataset="cifar10", download=False, unlabelled_size=3)
    u = stl10.unlabelled_set(d, train, 7, tmp_path / "stl10")
    pick = unlabelled_subset(5, 3, 7)  # the draw build_federation makes, so it keeps all three
    assert u.x.shape == (3, 32, 32, 3) and (u.y == -1).all()
    upright = stl10.stl10_images_from_binary(raw[pick])
    assert np.array_equal(u.x, stl10.resize_images(upright, (32, 32)))
    with pytest.raises(DataError, match=f"^{tmp_path / 'none' / stl10.FOLDER / stl10.UNLABELLED_FILE}: STL-10's "
                                        "unlabelled images not found") as e:
        stl10.unlabelled_set(d, train, 7, tmp_path / "none")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("over, message", [
    ({"data__server_size": 0}, "algorithm.name = 'feddf' distils on the server's unlabelled data, and the server has "
                               "none: expected data.unlabelled = a source"),
    ({"data__server_source": "dataset", "data__server_dataset": "stl10_unlabelled", "algorithm__name": "fsl"},
     "data.server_dataset = 'stl10_unlabelled' has no labels, and D0 needs them: expected a labelled source, or "
     "data.unlabelled = 'stl10_unlabelled' (FedDF's unlabelled data)"),
    ({"robust__aggregator": "median"}, "robust.aggregator = 'median' with algorithm.name = 'feddf': its distillation "
                                       "reads each client's model"),
    ({"privacy__clip": 1.0, "privacy__noise_multiplier": 1.0}, "privacy.clip = 1.0 with algorithm.name = 'feddf': its "
                                                               "distillation reads each client's model"),
    ({"server__learning": "parallel"}, "server.learning = 'parallel' (FSL-p) composes with"),
    ({"distill__val_fraction": 1.0}, "distill.val_fraction = 1.0: Input should be less than 1"),
])
def test_bad_feddf_configs_stop_with_one_line(over, message):
    with pytest.raises(config.ConfigError) as e:
        make_config(**over)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_unlabelled_size_beyond_the_source_stops_with_one_line():
    from fedsl.data.datasets import build_federation
    from fedsl.data.partition import PartitionError
    cfg = make_config(data__unlabelled_size=13)
    with pytest.raises(PartitionError, match=r"^data.unlabelled_size = 13: the unlabelled data \(data.unlabelled\) "
                                             r"has only 12 images$"):
        build_federation(cfg.data, cfg.seed)


def test_distill_without_validation_runs_every_step_and_returns_the_last_model():
    """val_fraction = 0: no early stopping, K steps; the same function with a model made of one linear layer."""
    torch.manual_seed(0)
    w = {"w": torch.randn(3, 2, dtype=torch.float64)}
    teachers = {"w": torch.randn(2, 3, 2, dtype=torch.float64)}
    inputs = torch.randn(8, 2, dtype=torch.float64)

    seen = []

    def fwd(p, x, key=None, weights=None):
        if weights is not None:  # the student: it is handed each batch's weights (BatchNorm counts samples by them)
            seen.append(weights)
        return x @ p["w"].T

    d = Distillation(lr=0.1, steps=5, batch_size=4, val_fraction=0.0)
    idx = torch.arange(8).repeat(3)[:20].view(5, 4)
    weight = torch.full((5, 4), 0.25, dtype=torch.float64)
    weight[4, 3] = 0.0  # a padded row in the last batch
    out = distill(d, w, teachers, fwd, fwd, inputs, idx, weight, torch.zeros(5, dtype=torch.int64),
                  torch.zeros(0, dtype=torch.int64))
    assert out.steps == 5 and out.best_step is None and out.history == [] and not torch.equal(out.x["w"], w["w"])
    assert len(seen) == 5 and all(torch.equal(s, weight[k]) for k, s in enumerate(seen))


def test_feddf_plus_fsl_runs_end_to_end_and_says_what_it_read(tmp_path, one_thread):
    """`fedsl run`'s path: a 2-round FedDF + FSL run on the small CNN (dropout on in the student's steps); its
    summary names U and each distillation setting with where its default comes from."""
    from conftest import tiny_config

    from fedsl.runs.runner import run
    data = tiny_config(rounds=2, alg="feddf", threads=1)
    data["server"] = {"learning": "incremental"}
    data["distill"] = {"steps": 4, "batch_size": 4, "eval_every": 2, "patience": 2}
    s = run(config.validate(data), tmp_path / "r", log=lambda _: None, progress=False)
    assert s["status"] == "completed"
    assert s["server_data"]["size"] == 12 and s["server_data"]["unlabelled"] == {"size": 12, "source": "server"}
    hp = s["hyperparameters"]
    assert hp["η_g"] == {"value": 1.0, "source": "default for feddf"}
    assert hp["K_kd"] == {"value": 4, "source": "set"}
    assert hp["η_kd"] == {"value": 1e-3, "source": "default: FedDF's paper"}
    assert hp["val_kd"]["source"] == "default: ours" and hp["clip_kd"]["source"] == "default: FedDF's code"
