"""BatchNorm in a pure-function engine (``fedsl.models.batchnorm``, ``model.batchnorm``): training statistics over the
real samples only (padding left out), evaluation statistics re-estimated as torch's ``update_bn`` does, on the
clients' samples, on D0 or per batch; the executors and stacked runs agree; keys read only where they mean something."""

import copy
import json

import pytest
import torch
from conftest import tiny_config
from torch import nn
from torch.optim.swa_utils import update_bn

from fedsl.algorithms.base import LOCAL_SGD
from fedsl.cli import main
from fedsl.config import schema as C
from fedsl.engine.functional import FunctionalModel, client_gradient
from fedsl.models.batchnorm import WeightedBatchNorm
from fedsl.runs.build import prepare
from fedsl.runs.runner import run, run_stacked

BN_MODELS = '''
from torch import nn


def bn_net(num_classes, input_shape, track=True):
    return nn.Sequential(nn.Conv2d(input_shape[0], 4, 3, stride=2), nn.BatchNorm2d(4, track_running_stats=track),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64, 16),
                         nn.BatchNorm1d(16, track_running_stats=track), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, num_classes))


def bn_net_batch(num_classes, input_shape):
    return bn_net(num_classes, input_shape, track=False)
'''


def _net(track=True):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=track), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5), nn.BatchNorm1d(5, track_running_stats=track))


@pytest.mark.parametrize("track", [True, False])
def test_training_statistics_are_the_real_samples(track):
    """In training the layers normalise as nn.BatchNorm does; zero-weight padding rows change neither the real rows'
    outputs nor the loss's gradient (nn.BatchNorm's statistics would count them)."""
    ref = _net(track).double().train()
    fm = FunctionalModel(copy.deepcopy(ref).double())
    assert fm.norm_names == ["1", "5"] and fm.tracked_stats is track
    assert all(isinstance(fm.module.get_submodule(n), WeightedBatchNorm) for n in fm.norm_names)
    p = {n: v.double() for n, v in fm.params().items()}
    x, y = torch.randn(6, 3, 8, 8, dtype=torch.float64), torch.randint(0, 5, (6,))
    fm.train(True)
    torch.testing.assert_close(fm.forward(p, x), ref(x), rtol=0, atol=1e-12)
    padded_x, padded_y = torch.cat([x, x[:2]]), torch.cat([y, y[:2]])
    w = torch.cat([torch.full((6,), 1 / 6, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)])
    torch.testing.assert_close(fm.forward(p, padded_x, w=w)[:6], fm.forward(p, x), rtol=0, atol=1e-12)
    g = client_gradient(fm, LOCAL_SGD)
    alone = g(p, {}, x, y, torch.full((6,), 1 / 6, dtype=torch.float64), None)
    padded = g(p, {}, padded_x, padded_y, w, None)
    for n in p:
        torch.testing.assert_close(padded[n], alone[n], rtol=0, atol=1e-12, msg=n)
    # without the weights the padding would count: the test above can fail
    assert not torch.allclose(fm.forward(p, padded_x)[:6], fm.forward(p, x))


def test_evaluation_statistics_are_update_bns():
    """``statistics`` = torch.optim.swa_utils.update_bn over the same batches (each batch's mean and unbiased
    variance, averaged); evaluated with them, the model's outputs are nn.BatchNorm's in eval mode."""
    ref = _net().double()
    fm = FunctionalModel(copy.deepcopy(ref))
    p = fm.params()
    source = torch.randn(25, 3, 8, 8, dtype=torch.float64)
    stats = fm.statistics(p, source, batch_size=10)
    update_bn([source[i:i + 10] for i in range(0, 25, 10)], ref)
    ref.eval()
    for n in fm.norm_names:
        torch.testing.assert_close(stats[f"{n}.stat_mean"], ref.get_submodule(n).running_mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(stats[f"{n}.stat_var"], ref.get_submodule(n).running_var, rtol=0, atol=1e-12)
    fm.train(False)
    x = torch.randn(7, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(fm.forward(p, x, stats=stats), ref(x), rtol=0, atol=1e-12)
    assert fm.statistics(p, None) is None  # 'batch': no statistics, each batch its own


def test_modules_the_engine_cannot_run_are_refused():
    with pytest.raises(ValueError, match=r"'1' is LazyBatchNorm2d with parameters not yet made"):
        FunctionalModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.LazyBatchNorm2d()))
    with pytest.raises(ValueError, match=r"'1' is InstanceNorm2d with running statistics"):
        FunctionalModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True)))
    FunctionalModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4)))  # a sample's own statistics: fine


@pytest.fixture
def bn_models(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")  # imported factories are code: opted in
    (tmp_path / "bn_models.py").write_text(BN_MODELS)
    return tmp_path


def _cfg(folder, rounds=3, model="bn_net", **model_keys):
    data = tiny_config(rounds=rounds, dtype="float64", executor="sequential", eval_every=1)
    data["model"] = {"name": f"bn_models:{model}", "import_dir": str(folder), **model_keys}
    return data


def _metrics(out):
    """metrics.csv less its wall_time column."""
    lines = [r.split(",") for r in (out / "metrics.csv").read_text().splitlines()]
    at = lines[0].index("wall_time")
    return "\n".join(",".join(r[:at] + r[at + 1:]) for r in lines)


def _params(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["params"]


def test_modes_train_alike_and_evaluate_as_update_bn_on_their_data(bn_models, tmp_path):
    """'clients', 'server' and 'batch' train the same models (evaluation reads the model only) and evaluate them
    differently; 'server''s final accuracy is the original nn.Module's after update_bn on D0."""
    outs = {}
    for mode in ("clients", "server", "batch"):
        outs[mode] = tmp_path / mode
        s = run(C.validate(_cfg(bn_models, batchnorm=mode)), outs[mode], log=lambda s: None, progress=False)
        assert s["status"] == "completed"
    for n, v in _params(outs["clients"]).items():
        for mode in ("server", "batch"):
            torch.testing.assert_close(_params(outs[mode])[n], v, rtol=0, atol=0)
    accs = {m: json.loads((o / "summary.json").read_text())["final_accuracy"] for m, o in outs.items()}
    assert len({_metrics(o).split("\n", 2)[2] for o in outs.values()}) == 3, accs  # rounds 1..3 differ
    # the independent computation: the user's own module, its running statistics made by torch from D0
    cfg = C.validate(_cfg(bn_models, batchnorm="server"))
    prep = prepare(cfg)
    fed = prep.sim.fed
    from bn_models import bn_net
    ref = bn_net(fed.num_classes, fed.input_shape).double()
    ref.load_state_dict(_params(outs["server"]), strict=False)
    d0 = fed.x[torch.as_tensor(fed.server)].contiguous()
    update_bn([d0[i:i + cfg.eval_batch_size] for i in range(0, len(d0), cfg.eval_batch_size)], ref)
    ref.eval()
    with torch.no_grad():
        acc = (ref(fed.x_test.contiguous()).argmax(1) == fed.y_test).double().mean().item()
    last = _metrics(outs["server"]).splitlines()[-1].split(",")
    header = _metrics(outs["server"]).splitlines()[0].split(",")
    assert float(last[header.index("accuracy")]) == pytest.approx(acc, abs=1e-12)


def test_auto_and_executors_and_stacks_agree(bn_models, tmp_path):
    """'auto': 'clients' for layers with running statistics, 'batch' without; the sequential and vectorised
    executors give the same run, and so do two seeds stacked and alone."""
    seq = run(C.validate(_cfg(bn_models)), tmp_path / "seq", log=lambda s: None, progress=False)
    auto = json.loads((tmp_path / "seq" / "config.json").read_text())["model"]["batchnorm"]
    assert auto == "auto" and seq["status"] == "completed"
    clients = run(C.validate(_cfg(bn_models, batchnorm="clients")), tmp_path / "clients", log=lambda s: None,
                  progress=False)
    assert clients["final_accuracy"] == seq["final_accuracy"]
    data = _cfg(bn_models)
    data["executor"] = "vectorised"
    vec = run(C.validate(data), tmp_path / "vec", log=lambda s: None, progress=False)
    assert vec["final_accuracy"] == pytest.approx(seq["final_accuracy"], abs=1e-9)
    for n, v in _params(tmp_path / "seq").items():
        torch.testing.assert_close(_params(tmp_path / "vec")[n], v, rtol=0, atol=1e-10, msg=n)
    batch = run(C.validate(_cfg(bn_models, model="bn_net_batch")), tmp_path / "nb", log=lambda s: None,
                progress=False)
    as_batch = run(C.validate(_cfg(bn_models, model="bn_net", batchnorm="batch")), tmp_path / "b",
                   log=lambda s: None, progress=False)
    assert batch["final_accuracy"] == as_batch["final_accuracy"]
    cfgs = []
    for seed in (1, 2):
        d = _cfg(bn_models)
        d.update(seed=seed, executor="vectorised")
        cfgs.append(C.validate(d))
    ends = run_stacked(cfgs, [tmp_path / "s1", tmp_path / "s2"], log=lambda s: None, progress=False)
    for cfg, end, name in zip(cfgs, ends, ("a1", "a2")):
        alone = run(cfg, tmp_path / name, log=lambda s: None, progress=False)
        assert end["final_accuracy"] == pytest.approx(alone["final_accuracy"], abs=1e-9)
        assert _metrics(tmp_path / name) == _metrics(tmp_path / ("s" + name[1]))


@pytest.mark.parametrize("sets, says", [
    (["model.batchnorm=server", "model.name=small_cnn"], "model.batchnorm is read only for a model with BatchNorm"),
    (["model.batchnorm_samples=50", "model.name=small_cnn"], "model.batchnorm_samples is read only for a model with"),
    (["model.batchnorm=server", "data.server_size=0"], "model.batchnorm = 'server' estimates BatchNorm's statistics "
                                                       "on D0, but the run has no server data"),
    (["model.batchnorm=batch", "model.batchnorm_samples=50"], "model.batchnorm_samples is read only with "
                                                              "model.batchnorm = 'clients' (here 'batch')"),
    (["model.batchnorm=mean"], "model.batchnorm"),
    (["model.batchnorm=clients", "model.batchnorm_clients=5"], "model.batchnorm_clients is read only with "
                                                               "model.batchnorm = 'local' (here 'clients')"),
])
def test_keys_read_only_where_they_mean_something(bn_models, tmp_path, capsys, sets, says):
    import tomli_w
    data = _cfg(bn_models)
    data["algorithm"]["name"] = "fedavg"
    config = tmp_path / "c.toml"
    config.write_bytes(tomli_w.dumps(data).encode())
    args = ["run", str(config), "--out", str(tmp_path / "o")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- FedBN: model.batchnorm = "local"


def _clients_table(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["clients"]


def test_fedbn_keeps_each_clients_batchnorm_and_federates_the_rest(bn_models, tmp_path):
    """FedAvg with local BatchNorm: x's γ, β never move (the clients send x_t's back), every other parameter does;
    the clients sampled keep their own γ, β (the others x_0's), in the checkpoint, so that an interrupted run resumes
    to the uninterrupted one; the accuracy is the personal models', not the global model's."""
    data = _cfg(bn_models, rounds=4, batchnorm="local", batchnorm_clients=3)
    data["algorithm"]["name"] = "fedavg"
    cfg = C.validate(data)
    end = run(cfg, tmp_path / "bn", log=lambda s: None, progress=False)
    assert end["status"] == "completed"
    prep = prepare(cfg)
    x0, x4 = prep.sim.initial_params(), _params(tmp_path / "bn")
    names = prep.sim.alg.rule.names
    assert names == ("1.weight", "1.bias", "6.weight", "6.bias")
    for n in x0:
        assert (not torch.equal(x0[n], x4[n])) is (n not in names), n
    cut = run(cfg, tmp_path / "cut", log=lambda s: None, progress=False, stop_after=3)
    assert cut["status"] == "interrupted"
    own = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["clients"]["local_norm"]
    moved = [i for i in range(6) if not torch.equal(own["1.weight"][i], x0["1.weight"])]
    assert len(moved) >= 3  # S = 3 a round for 3 rounds: at least 3 clients trained (the others hold x_0's)
    resumed = run(cfg, tmp_path / "cut", resume=True, log=lambda s: None, progress=False)
    assert resumed["final_accuracy"] == end["final_accuracy"]
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "bn")
    data["model"]["batchnorm"] = "clients"
    data["model"].pop("batchnorm_clients")
    other = run(C.validate(data), tmp_path / "avg", log=lambda s: None, progress=False)
    assert other["final_accuracy"] != end["final_accuracy"]


def test_fedbn_accuracy_is_each_clients_own_model_as_torch_computes_it(bn_models, tmp_path):
    """The evaluation of 'local': for each evaluation client, the user's nn.Module with x's parameters and the
    client's own γ, β, its running statistics made by update_bn from the client's training samples, scored on the
    test set weighted by the client's label mix; the accuracy is their mean. Sequential = vectorised."""
    from bn_models import bn_net

    from fedsl.engine.per_client import label_mix
    data = _cfg(bn_models, rounds=4, batchnorm="local", batchnorm_clients=2)
    cfg = C.validate(data)
    run(cfg, tmp_path / "cut", log=lambda s: None, progress=False, stop_after=3)  # keeps the clients' tables
    prep = prepare(cfg)
    sim, fed = prep.sim, prep.sim.fed
    x = _params(tmp_path / "cut")
    own = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["clients"]["local_norm"]
    mix = label_mix(fed)
    accs = []
    for i in sim.norm_clients:
        ref = bn_net(fed.num_classes, fed.input_shape).double()
        ref.load_state_dict({**x, **{n: v[i] for n, v in own.items()}}, strict=False)
        mine = fed.x[torch.as_tensor(sim.client_data[int(i)])].contiguous()
        update_bn([mine[j:j + cfg.eval_batch_size] for j in range(0, len(mine), cfg.eval_batch_size)], ref)
        ref.eval()
        with torch.no_grad():
            right = (ref(fed.x_test.contiguous()).argmax(1) == fed.y_test).double()
        per_class = torch.stack([right[fed.y_test == c].mean() for c in range(fed.num_classes)]).numpy()
        accs.append(float((mix[i] * per_class).sum() / mix[i].sum()))
    rows = _metrics(tmp_path / "cut").splitlines()
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert float(last["accuracy"]) == pytest.approx(sum(accs) / len(accs), abs=1e-12)
    data["executor"] = "vectorised"
    run(C.validate(data), tmp_path / "vec", log=lambda s: None, progress=False, stop_after=3)
    vec = _metrics(tmp_path / "vec").splitlines()
    assert float(dict(zip(vec[0].split(","), vec[-1].split(",")))["accuracy"]) == pytest.approx(
        float(last["accuracy"]), abs=1e-9)


def test_fedbn_is_refused_on_flower_and_its_key_elsewhere(bn_models, tmp_path, capsys):
    from fedsl.flower.config import load_setup
    rc = {"seed": 1, "dtype": "float64", "data.dataset": "synthetic_chars", "data.chars": "0123",
          "data.train_per_class": 60, "data.test_per_class": 10, "data.num_clients": 3, "data.classes_per_client": 2,
          "data.samples_per_client": 60,
          "model.name": "bn_models:bn_net", "model.import_dir": str(bn_models), "model.batchnorm": "local",
          "algorithm.name": "fedavg", "algorithm.clients_per_round": 2, "num-server-rounds": 2}
    with pytest.raises(C.ConfigError, match=r"model.batchnorm = 'local' \(FedBN\) evaluates each client's own "
                                            r"BatchNorm, which the nodes keep"):
        load_setup(rc)
    load_setup({**rc, "model.batchnorm": "server", "data.server_size": 12})  # the other modes run on Flower


def test_a_completed_fedbn_run_is_not_extended(bn_models, tmp_path, capsys):
    """Its checkpoint holds no client tables (as SCAFFOLD's): `fedsl resume --rounds` refuses in one line and leaves
    the folder as it was."""
    data = _cfg(bn_models, rounds=2, batchnorm="local", batchnorm_clients=2)
    run(C.validate(data), tmp_path / "run", log=lambda s: None, progress=False)
    before = {p: p.read_bytes() for p in sorted((tmp_path / "run").rglob("*")) if p.is_file() and p.name != ".lock"}
    assert main(["resume", str(tmp_path / "run"), "--rounds", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.batchnorm = 'local' keeps each client's BatchNorm" in err[0], err
    assert before == {p: p.read_bytes() for p in sorted((tmp_path / "run").rglob("*"))
                      if p.is_file() and p.name != ".lock"}
