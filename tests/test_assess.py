"""fedsl data assess: ξ², G², cos = diagnostics.measure; L against the exact Hessian; ranking; CLI."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import random_federation

import fedsl.assess as A
from fedsl.cli import main
from fedsl.config import loading
from fedsl.config import schema as C
from fedsl.engine.diagnostics import measure
from fedsl.engine.functional import FunctionalModel
from fedsl.models import build_model
from fedsl.runs.build import prepare
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run

BASE = {"name": "tiny", "rounds": 4, "seed": 0,
        "data": {"dataset": "synthetic_chars", "chars": "0123456789", "train_per_class": 60, "test_per_class": 10,
                 "num_clients": 20, "classes_per_client": 2, "server_size": 100},
        "model": {"name": "linear"},
        "algorithm": {"name": "fsl", "clients_per_round": 5, "batch_size": 10, "local_lr": 0.05}}
SKEWED = ["data.server_source='clients'", "data.server_clients=1", "data.server_samples_per_client=30",
          "data.server_size=0"]  # one client's D0: 2 of the 10 classes


def _cfg(**over):
    data = json.loads(json.dumps(BASE))
    for k, v in over.items():
        loading.set_dotted(data, k.replace("__", "."), v)
    return C.validate(data)


def test_numbers_equal_diagnostics_measure_at_x0_and_the_step_is_the_runs():
    cfg = _cfg(server__gamma=0.5)
    [a] = A.assess(cfg, [A.Candidate("iid40", ["data.server_size=40"])], power_iters=3)
    prep = prepare(C.validate({**cfg.model_dump(), "data": {**cfg.model_dump()["data"], "server_size": 40}}))
    d = measure(prep.sim.fm, prep.sim.initial_state().x, prep.sim.fed)
    assert a.n0 == 40
    assert a.xi2 == pytest.approx(d.xi2, rel=1e-6) and a.G2 == pytest.approx(d.G2, rel=1e-6)
    assert a.cos_F_f0 == pytest.approx(d.cos_F_f0, rel=1e-6)
    # γ·η0 by the paper's rules: n = 600 over N = 20, B = B0 = 10: K = 3, E_s = ⌈600/(20·40)⌉ = 1, K0 = 4
    assert a.server_lr == pytest.approx(0.5 * math.sqrt(5) * 0.05 * 3 / 4)
    # the condition and the first-order prediction are one inequality
    assert a.condition == (2 * a.dot_F_f0 > a.L * a.server_lr * a.gradf0_norm2) == (a.predicted_gain > 0)
    assert a.predicted_gain == pytest.approx(a.server_lr * a.dot_F_f0 - a.L * a.server_lr ** 2 * a.gradf0_norm2 / 2)
    assert a.server_steps == 4 and a.round_gain_rel == pytest.approx(4 * a.predicted_gain_rel)


def test_assess_server_data_equals_measure_on_a_random_federation():
    fed = random_federation([9, 31, 17, 24], n0=12, dtype=torch.float64)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), 0).double())
    x = fm.params()
    side = A.client_side(fm, x, fed, hessian_samples=0, power_iters=2)
    a = A.assess_server_data(fm, x, fed, 0.1, side)
    d = measure(fm, x, fed)
    assert (a.xi2, a.G2) == pytest.approx((d.xi2, d.G2), rel=1e-10)
    assert a.cos_F_f0 == pytest.approx(d.cos_F_f0, rel=1e-10)


def _exact_top_eigenvalue(fm, params, x, y):
    names = list(params)
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]

    def f(flat):
        p = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}
        w = torch.full((len(x),), 1.0 / len(x), dtype=x.dtype)
        return fm.loss(p, x, y, w, None)

    flat = torch.cat([params[n].flatten() for n in names])
    H = torch.autograd.functional.hessian(f, flat)
    return float(torch.linalg.eigvalsh(H).abs().max())


def test_L_is_the_top_hessian_eigenvalue_of_a_logistic_regression():
    fed = random_federation([30, 40, 50], n0=10, dtype=torch.float64)
    fm = FunctionalModel(build_model("linear", 4, (1, 8, 8), 0).double())
    g = torch.Generator().manual_seed(1)
    x = {k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in fm.params().items()}
    fm.train(False)
    union = torch.as_tensor(np.concatenate(fed.clients))
    exact = _exact_top_eigenvalue(fm, x, fed.x[union], fed.y[union])
    est, iters = A.hessian_norm(fm, x, fed.x[union], fed.y[union], iters=2000, tol=1e-13)
    assert est == pytest.approx(exact, rel=1e-6) and iters < 2000
    # the clients' side reads all of them with hessian_samples = 0, and F's L is theirs
    side = A.client_side(fm, x, fed, hessian_samples=0, power_iters=2000, power_tol=1e-13)
    assert side.L == pytest.approx(exact, rel=1e-6) and side.hessian_samples == 120
    # a subsample of the clients' data: a different F, so a different (close) L
    sub = A.client_side(fm, x, fed, hessian_samples=60, power_iters=2000, power_tol=1e-13)
    assert sub.hessian_samples == 60 and sub.L != pytest.approx(exact, rel=1e-6)


def test_hessian_vector_product_equals_the_exact_hessian_times_v():
    fed = random_federation([20, 20], n0=4, dtype=torch.float64, num_classes=3, shape=(1, 4, 4))
    fm = FunctionalModel(build_model("mlp", 3, (1, 4, 4), 0).double())
    x = fm.params()
    fm.train(False)
    X, Y = fed.x[:40], fed.y[:40]
    g = torch.Generator().manual_seed(2)
    v = {k: torch.randn(p.shape, generator=g, dtype=p.dtype) for k, p in x.items()}
    hv = A.hessian_vector(fm, x, X, Y, v, batch_size=7)  # chunks add up
    names = list(x)

    def f(*ps):
        w = torch.full((40,), 1.0 / 40, dtype=X.dtype)
        return fm.loss(dict(zip(names, ps)), X, Y, w, None)

    _, exact = torch.autograd.functional.hvp(f, tuple(x[n] for n in names), tuple(v[n] for n in names))
    for n, e in zip(names, exact):
        assert torch.allclose(hv[n], e, rtol=1e-9, atol=1e-12)


def test_iid_d0_ranks_above_a_class_skewed_d0_on_a_c2_partition():
    cfg = _cfg(data__train_per_class=100)
    res = A.assess(cfg, [A.Candidate("skewed", SKEWED), A.Candidate("iid500", ["data.server_size=500"])])
    by = {r.name: r for r in res}
    assert [r.name for r in res] == ["iid500", "skewed"] and by["iid500"].rank == 1
    assert sum(1 for c in by["skewed"].server_histogram if c) == 2  # the skewed D0 holds two classes
    assert by["iid500"].xi2 < by["skewed"].xi2 and by["iid500"].cos_F_f0 > by["skewed"].cos_F_f0
    assert by["iid500"].verdict == A.LIKELY and by["skewed"].verdict == A.LESS  # acute, but the condition fails
    assert by["iid500"].L == by["skewed"].L and by["iid500"].G2 == by["skewed"].G2  # one F, computed once


def test_warmup_rounds_measure_at_the_fedavg_model_of_round_R(tmp_path):
    cfg = _cfg()
    [a0] = A.assess(cfg, [A.Candidate("iid", ["data.server_size=100"])], power_iters=2)
    [a2] = A.assess(cfg, [A.Candidate("iid", ["data.server_size=100"])], warmup_rounds=2, power_iters=2)
    fedavg = C.validate({**cfg.model_dump(), "rounds": 2, "diag_every": 2, "algorithm": {**BASE["algorithm"],
                                                                                        "name": "fedavg"}})
    run(fedavg, tmp_path / "r", log=lambda m: None, progress=False)
    row = RunDir(tmp_path / "r").read_metrics()[-1]
    assert row["round"] == 2 and a2.extra["warmup_rounds"] == 2
    assert (a2.xi2, a2.G2, a2.cos_F_f0) == pytest.approx((row["xi2"], row["G2"], row["cos_F_f0"]), rel=1e-5)
    assert a2.G2 != pytest.approx(a0.G2, rel=1e-3)


def test_candidates_from_variants_and_override_splitting():
    cfg = C.validate({**BASE, "variants": {"FedAvg": {"algorithm": {"name": "fedavg"}},
                                           "iid50": {"data": {"server_size": 50}},
                                           "stl": {"data": {"server_source": "dataset", "server_dataset": "stl10",
                                                            "server_per_class": 56}}}})
    cands, skipped = A.candidates_from_variants(cfg)
    assert skipped == ["FedAvg"] and [c.name for c in cands] == ["iid50", "stl"]
    assert cands[1].overrides == ['data.server_source="dataset"', 'data.server_dataset="stl10"',
                                  "data.server_per_class=56"]
    assert A.split_overrides("a=1, b=[1,2],c='x,y'") == ["a=1", "b=[1,2]", "c='x,y'"]
    c = A.parse_candidate("stl10:data.server_source=dataset,data.server_dataset=stl10,server.gamma=0.5")
    assert c.name == "stl10" and len(c.overrides) == 3


def _write(tmp_path, data) -> str:
    p = tmp_path / f"c{len(list(tmp_path.glob('c*.json')))}.json"  # configs may be JSON too
    p.write_text(json.dumps(data))
    return str(p)


@pytest.fixture
def config_file(tmp_path):
    return _write(tmp_path, BASE)


def test_cli_two_candidates_writes_json_csv_and_prints_the_table(tmp_path, config_file, capsys):
    out = tmp_path / "a"
    assert main(["data", "assess", config_file, "--candidate", "iid100:data.server_size=100",
                 "--candidate", "skewed:" + ",".join(SKEWED), "--power-iters", "5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "candidate server datasets at x_0" in text and "iid100" in text and "likely to help" in text
    assert "1. iid100: likely to help" in text and "2. skewed: may help less, or hurt" in text
    js = json.loads((out / "assess.json").read_text())
    assert [c["name"] for c in js["candidates"]] == ["iid100", "skewed"] and js["config"] == "tiny"
    assert js["L_method"].startswith("power iteration")
    rows = (out / "assess.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("rank,name,n0,xi2,G2,cos_F_f0,L,server_lr,condition")
    assert sorted(p.name for p in out.iterdir()) == ["assess.csv", "assess.json"]  # nothing else, nowhere else
    # the folder is not overwritten
    assert main(["data", "assess", config_file, "-c", "a:data.server_size=10", "--out", str(out)]) == 2
    assert "already holds assess.json" in capsys.readouterr().err


@pytest.mark.parametrize("spec, expected", [
    ("iid500", "expected NAME:key=value"),
    ("x:data.num_clients=3", "'data.num_clients' is not a server-data key"),
    ("x:data.server_size", "'data.server_size' is not key=value"),
    ("x:data.server_size=-5", "candidate 'x': data.server_size = -5"),
    ("x:data.server_source='clients',data.server_clients=99", "candidate 'x': data.server_clients = 99"),
])
def test_bad_candidate_spec_is_a_one_line_error(tmp_path, config_file, capsys, spec, expected):
    assert main(["data", "assess", config_file, "--candidate", spec, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "o").exists()


def test_no_candidates_and_bad_options_are_one_line_errors(tmp_path, config_file, capsys):
    assert main(["data", "assess", config_file, "--out", str(tmp_path / "o")]) == 2
    assert "no candidates" in capsys.readouterr().err
    assert main(["data", "assess", config_file, "-c", "a:data.server_size=10", "-c", "a:data.server_size=20"]) == 2
    assert "expected distinct names" in capsys.readouterr().err
    assert main(["data", "assess", config_file, "-c", "a:data.server_size=10", "--warmup-rounds", "-1"]) == 2
    assert "--warmup-rounds -1" in capsys.readouterr().err
    fedavg = _write(tmp_path, {**BASE, "algorithm": {**BASE["algorithm"], "name": "fedavg"}})
    assert main(["data", "assess", fedavg, "-c", "a:data.server_size=10", "--out", str(tmp_path / "o")]) == 2
    assert "takes no server step on D0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_verdicts_name_their_reason():
    from dataclasses import replace
    good = A.Assessment("d", [], 10, [5, 5], xi2=1.0, G2=4.0, cos_F_f0=0.9, dot_F_f0=2.0, gradF_norm2=2.0,
                        gradf0_norm2=2.5, L=10.0, server_lr=0.01, condition=True, condition_margin=3.75,
                        predicted_gain=0.019, predicted_gain_rel=0.19, measured_gain=0.02, measured_gain_rel=0.2,
                        F=2.3, server_steps=2, round_gain_rel=0.38, verdict="", reason="")
    assert A.judge(good)[0] == A.LIKELY
    verdict, reason = A.judge(replace(good, xi2=5.0))
    assert verdict == A.UNCLEAR and "ξ² = 5 > G² = 4" in reason
    verdict, reason = A.judge(replace(good, condition=False))
    assert verdict == A.LESS and "condition fails" in reason and "may overshoot" in reason
    verdict, reason = A.judge(replace(good, cos_F_f0=-0.1, dot_F_f0=-0.2))
    assert verdict == A.UNLIKELY and "angle ≥ 90°" in reason
    ranked = A.rank([replace(good, name="a", round_gain_rel=-1.0), replace(good, name="b"),
                     replace(good, name="c", round_gain_rel=float("nan"))])
    assert [(r.name, r.rank) for r in ranked] == [("b", 1), ("a", 2), ("c", 3)]
