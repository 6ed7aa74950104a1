"""ξ², G² and cos(∇F, ∇f0): vectorised computation = per-client loop by hand; behaviour on IID vs non-IID data."""

import numpy as np
import pytest
import torch
from conftest import random_federation

from fedsl.config import schema as C
from fedsl.data.partition import by_classes, iid
from fedsl.engine.diagnostics import measure
from fedsl.engine.functional import FunctionalModel, full_gradient
from fedsl.models import build_model
from fedsl.runs.results import RunDir
from fedsl.runs.runner import run


def _flat(g):
    return torch.cat([v.flatten() for v in g.values()])


@pytest.mark.parametrize("chunk_sizes", [[9, 31, 17, 24], [5] * 20])
def test_diagnostics_equal_a_per_client_loop(chunk_sizes):
    fed = random_federation(chunk_sizes, n0=12, dtype=torch.float64)
    fm = FunctionalModel(build_model("small_cnn", 4, (1, 8, 8), 0).double())
    x = fm.params()
    d = measure(fm, x, fed)
    sel = lambda idx: (fed.x[torch.as_tensor(idx)], fed.y[torch.as_tensor(idx)])
    gF = _flat(full_gradient(fm, x, *sel(np.concatenate(fed.clients))))
    g0 = _flat(full_gradient(fm, x, *sel(fed.server)))
    G2 = np.mean([float(((_flat(full_gradient(fm, x, *sel(c))) - gF) ** 2).sum()) for c in fed.clients])
    assert d.G2 == pytest.approx(G2, rel=1e-9)
    assert d.xi2 == pytest.approx(float(((g0 - gF) ** 2).sum()), rel=1e-9)
    assert d.cos_F_f0 == pytest.approx(float(gF @ g0 / gF.norm() / g0.norm()), rel=1e-9)


def test_non_iid_clients_have_larger_G2_and_iid_server_small_xi2():
    g = torch.Generator().manual_seed(0)
    labels = np.repeat(np.arange(4), 100)
    centers = torch.randn(4, 1, 8, 8, generator=g) * 2
    x = centers[labels] + 0.5 * torch.randn(400, 1, 8, 8, generator=g)
    y = torch.as_tensor(labels)
    fm = FunctionalModel(build_model("linear", 4, (1, 8, 8), 0).double())
    params = fm.params()

    def fed_with(clients, server):
        from fedsl.data.federation import Federation
        return Federation(x.double(), y, clients, server, x[:10].double(), y[:10], 4, list("abcd"))

    noniid = by_classes(labels, 8, 1, 50, seed=0)
    iid_clients = iid(400, 8, 50, seed=0)
    iid_server = np.arange(0, 400, 4)  # 25 per class
    one_class_server = np.arange(0, 100)  # class 0 only
    d_non = measure(fm, params, fed_with(noniid, iid_server))
    d_iid = measure(fm, params, fed_with(iid_clients, iid_server))
    d_bad = measure(fm, params, fed_with(noniid, one_class_server))
    assert d_non.G2 > 10 * d_iid.G2
    assert d_non.xi2 < d_non.G2 and d_bad.xi2 > d_non.xi2  # a representative D0 beats a one-class D0
    assert d_non.cos_F_f0 > 0.9 > d_bad.cos_F_f0


def test_runner_logs_diagnostics_every_k_rounds(tmp_path):
    cfg = C.validate({"rounds": 4, "diag_every": 2, "eval_every": 3, "eval_final_window": False,
                      "data": {"dataset": "synthetic_chars", "chars": "0123", "train_per_class": 20,
                               "test_per_class": 10, "num_clients": 4, "server_size": 8},
                      "model": {"name": "linear"},
                      "algorithm": {"name": "fsl", "clients_per_round": 2, "batch_size": 5}})
    s = run(cfg, tmp_path / "r", log=lambda m: None, progress=False)
    rows = RunDir(tmp_path / "r").read_metrics()
    assert [r["round"] for r in rows] == [0, 2, 3, 4]  # diagnostics force an evaluation at rounds 2 and 4
    assert rows[1]["G2"] > 0 and rows[1]["xi2"] > 0 and -1 <= rows[1]["cos_F_f0"] <= 1
    assert rows[2]["G2"] is None
    assert set(s["initial_diagnostics"]) == {"xi2", "G2", "cos_F_f0"}
    assert {k: rows[0][k] for k in ("xi2", "G2", "cos_F_f0")} == s["initial_diagnostics"]  # row 0 is x_0
