"""executor = 'auto' on a CPU (``experiments.placement.resolve_executor``): the process pool for long runs on free
cores, the sequential executor otherwise; and the FLOP count it weighs a run by (``models.flops``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from torch import nn

from fedsl.config.schema import POOL_MIN_GFLOP, RunConfig
from fedsl.models import build_model
from fedsl.models.flops import forward_flops, train_flops
from fedsl.runs import build, placement


def test_flops_of_the_papers_cnns_are_torchs_counts():
    # torch.utils.flop_counter.FlopCounterMode on a forward + backward of each model (benchmarks/RESULTS.md's table):
    # 35.0 and 84.0 MFLOP per training sample, 12.3 and 28.2 per evaluated one
    cifar = build_model("cifar_cnn", 10, (3, 32, 32), seed=0)
    emnist = build_model("emnist_cnn", 47, (1, 28, 28), seed=0)
    assert train_flops(cifar, (3, 32, 32)) == 35_003_904 and forward_flops(cifar, (3, 32, 32)) == 12_257_792
    assert train_flops(emnist, (1, 28, 28)) == 84_006_144 and forward_flops(emnist, (1, 28, 28)) == 28_152_576
    # a linear model by hand: 2·in·out forward; its backward only the weights' gradient (the sample needs none)
    assert train_flops(nn.Linear(5, 3), (5,)) == 2 * (2 * 5 * 3)


def test_counting_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).double()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert forward_flops(model, (1, 8, 8)) == 2 * 4 * 6 * 6 * 9 + 2 * 2 * 144
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model[0]._forward_hooks and not model[3]._forward_hooks


@pytest.mark.parametrize("threads, free, s, gflop, pays", [
    (0, 2, 10, POOL_MIN_GFLOP, True),
    (0, 16, 2, 10 * POOL_MIN_GFLOP, True),
    (1, 2, 10, 10 * POOL_MIN_GFLOP, False),   # a set thread count asks for the sequential executor's
    (0, 1, 10, 10 * POOL_MIN_GFLOP, False),   # one free core (a loaded machine, a --parallel worker)
    (0, 2, 1, 10 * POOL_MIN_GFLOP, False),    # one client per round: nothing to spread
    (0, 2, 10, 0.99 * POOL_MIN_GFLOP, False),  # a short run: the workers' start is not won back
])
def test_the_rule(threads, free, s, gflop, pays):
    assert placement.pool_pays(threads, free, s, gflop) is pays


def _cfg(**over) -> RunConfig:
    return RunConfig.model_validate(tiny_config(rounds=over.pop("rounds", 1000), **over))


def test_the_runs_training_is_rounds_clients_steps_batch_flops():
    cfg = _cfg()  # S = 3, B = 8, E_c = 1: K = ceil((n / N) / B)
    assert placement.run_train_gflop(cfg, 6, 96, 1e9) == 1000 * 3 * 2 * 8
    cfg = RunConfig.model_validate({**tiny_config(rounds=10), "algorithm": {**tiny_config()["algorithm"],
                                                                            "local_steps": 5}})
    assert placement.run_train_gflop(cfg, 6, 96, 2e9) == 10 * 3 * 5 * 8 * 2


def test_auto_resolves_on_a_cpu_only():
    cpu, big, two = torch.device("cpu"), (lambda: 1e12), (lambda: 2)
    assert placement.resolve_executor(_cfg(), cpu, 6, 96, big, two) == "processes"
    assert placement.resolve_executor(_cfg(), cpu, 6, 96, lambda: 1e3, two) == "sequential"
    assert placement.resolve_executor(_cfg(), cpu, 6, 96, big, lambda: 1) == "sequential"
    for named in ("sequential", "processes", "vectorised"):
        assert placement.resolve_executor(_cfg(executor=named), cpu, 6, 96, big, two) == named
    asked = []
    assert placement.resolve_executor(_cfg(), torch.device("cuda"), 6, 96, lambda: asked.append(1) or 1e12,
                                      two) == "auto"  # make_executor's: vectorised on CUDA
    assert placement.resolve_executor(_cfg(executor="vectorised", compile="aot_eager"), cpu, 6, 96, big,
                                      two) == "vectorised"
    assert not asked  # the model's FLOPs are counted only for the choice on a CPU


def test_a_long_run_on_free_cores_gets_a_pool_of_one_worker_per_free_core(monkeypatch):
    monkeypatch.setattr(build.threads, "auto_threads", lambda: 2)
    prepared = build.prepare(_cfg(rounds=10**6))  # small_cnn on 6 clients: 10^6 rounds pass the threshold
    ex = prepared.sim.executor
    assert ex.name == "processes" and ex.workers == 2 and ex.pids == []  # its workers start at the first round
    short = build.prepare(_cfg(rounds=3))
    assert short.sim.executor.name == "sequential"


# ----------------------------------------------------------------------------- a group's runs side by side


@pytest.mark.parametrize("runs, threads, free, gflop, run_bytes, avail, n", [
    (3, [0, 0, 0], 2, POOL_MIN_GFLOP, 1e9, 64e9, 2),
    (3, [0, 0, 0], 8, POOL_MIN_GFLOP, 1e9, 64e9, 3),     # no more than the runs
    (8, [0] * 8, 8, POOL_MIN_GFLOP, 1e9, 4e9, 2),        # no more than half the available memory holds
    (8, [0] * 8, 8, POOL_MIN_GFLOP, 1e9, None, 8),       # memory not known: not limited
    (3, [0, 1, 0], 8, POOL_MIN_GFLOP, 1e9, 64e9, 1),     # a run that sets its threads
    (3, [0, 0, 0], 1, POOL_MIN_GFLOP, 1e9, 64e9, 1),     # one free core
    (1, [0], 8, POOL_MIN_GFLOP, 1e9, 64e9, 1),           # one run
    (3, [0, 0, 0], 8, 0.5 * POOL_MIN_GFLOP, 1e9, 64e9, 1),  # short runs
    (3, [0, 0, 0], 8, POOL_MIN_GFLOP, 40e9, 64e9, 1),    # too big for two at once
])
def test_the_side_by_side_rule(runs, threads, free, gflop, run_bytes, avail, n):
    assert placement.side_by_side(runs, threads, free, gflop, run_bytes, avail) == n


def test_a_groups_runs_are_weighed_by_what_their_checks_built(monkeypatch):
    from fedsl.config.expand import expand_variants
    monkeypatch.setattr(build.threads, "auto_threads", lambda: 2)
    seen = []
    real = placement.side_by_side
    monkeypatch.setattr(build, "side_by_side", lambda *a: seen.append(a) or real(*a))
    for rounds, expected in ((10**6, 2), (3, 1)):
        runs = expand_variants(RunConfig.model_validate(tiny_config(rounds=rounds, seeds=[0, 1, 2])))
        assert build.default_side_by_side(runs, build.check_all(runs)) == expected
    n_runs, threads_, free, gflop, run_bytes, _ = seen[0]
    one = build.check(_cfg(rounds=10**6), set(), keep=True)
    assert (n_runs, threads_, free) == (3, [0, 0, 0], 2) and run_bytes > one.fed.x.numel() * 4  # the pool at least
    per_run = placement.run_train_gflop(_cfg(rounds=10**6), one.fed.num_clients, one.fed.n,
                                        train_flops(one.fm.module, one.fed.input_shape))
    assert gflop == pytest.approx(3 * per_run) and per_run > placement.POOL_MIN_GFLOP


def test_fedsl_run_runs_them_side_by_side_unless_told(monkeypatch, tmp_path, capsys):
    """The command line's wiring: the rule's number becomes the pool's workers (the pool itself: test_parallel.py);
    --parallel 1 runs them one after another without asking the rule."""
    import json

    from conftest import TINY

    import fedsl.sweeps.parallel as parallel
    from fedsl.cli import main

    class Started(Exception):
        pass

    def pool(workers, quiet):
        raise Started(workers)

    asked = []
    monkeypatch.setattr(build, "default_side_by_side", lambda runs, built: asked.append(len(runs)) or 2)
    monkeypatch.setattr(parallel, "LocalPool", pool)
    config = tmp_path / "c.toml"
    config.write_text("seeds = [0, 1]\n" + TINY.format(rounds=1, alg="fedavg", dtype="float32", executor="auto"))
    with pytest.raises(Started) as started:
        main(["run", str(config), "--out", str(tmp_path / "auto")])
    assert started.value.args == (2,) and asked == [2]
    assert "running the 2 runs 2 side by side, one core each" in capsys.readouterr().out
    assert main(["run", str(config), "--out", str(tmp_path / "one"), "--parallel", "1", "--quiet"]) == 0
    assert asked == [2]  # not asked again
    runs = json.loads((tmp_path / "one" / "group.json").read_text())["runs"]
    assert len(runs) == 2 and all(json.loads((tmp_path / "one" / r / "summary.json").read_text())["status"]
                                  == "completed" for r in runs)
