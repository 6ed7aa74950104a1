"""The Python API is as safe and reproducible as the command line: a model wrapped with a seed is drawn from it
(``FunctionalModel(module, seed=...)``), and the simulator takes the command line's thread rule."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import random_federation
from torch import nn

from fedsl.engine.functional import FunctionalModel, reinitialise_


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3))


def test_a_seed_draws_the_same_parameters_and_leaves_the_callers_random_state_alone():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = FunctionalModel(_net(), seed=7).params()
    after = torch.random.get_rng_state()
    torch.manual_seed(999)  # whatever the global generator holds, the seed decides
    b = FunctionalModel(_net(), seed=7).params()
    c = FunctionalModel(_net(), seed=8).params()
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["1.weight"], c["1.weight"])
    # the draws came from a forked generator: the caller's stream is where _net()'s own construction left it
    torch.random.set_rng_state(state)
    _net()
    assert torch.equal(torch.random.get_rng_state(), after)


def test_without_a_seed_the_modules_own_parameters_are_kept():
    net = _net()
    with torch.no_grad():
        net[1].weight.fill_(0.25)
    assert torch.equal(FunctionalModel(net).params()["1.weight"], torch.full((5, 12), 0.25))


def test_a_parameter_no_reset_parameters_draws_is_refused_in_one_line():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.s

    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3), Scale())
    with pytest.raises(ValueError, match=r"^model parameter '2\.s' belongs to a module without reset_parameters"):
        reinitialise_(net, 0)


def test_the_simulator_sets_threads_as_the_command_line_does(monkeypatch):
    from fedsl import LocalTraining, Simulator, make_algorithm, make_executor
    from fedsl.core import threads

    fed = random_federation([10, 10, 10], dtype=torch.float32)
    fm = FunctionalModel(nn.Sequential(nn.Flatten(), nn.Linear(64, fed.num_classes)), seed=0)
    alg = make_algorithm("fedavg", LocalTraining(lr=0.1, batch_size=5), 1.0, None)
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_chosen", 1)  # what the rule decided for this process (a busy machine)
    try:
        torch.set_num_threads(2)
        Simulator(fm, fed, alg, make_executor("sequential", fm, torch.device("cpu")), 2, seed=0, threads=None)
        assert torch.get_num_threads() == 2  # None: torch's setting left alone
        Simulator(fm, fed, alg, make_executor("sequential", fm, torch.device("cpu")), 2, seed=0)
        assert torch.get_num_threads() == 1  # the default: the automatic rule
        Simulator(fm, fed, alg, make_executor("sequential", fm, torch.device("cpu")), 2, seed=0, threads=3)
        assert torch.get_num_threads() == 3  # pinned
    finally:
        torch.set_num_threads(before)


README_TOML = """
name = "my-run"
rounds = 2
[data]
dataset = "synthetic_chars"
num_clients = 4
classes_per_client = 2
samples_per_client = 20
server_size = 20
[model]
name = "small_cnn"
[algorithm]
name = "fsl"
clients_per_round = 2
local_lr = 0.05
batch_size = 10
"""


def test_one_toml_is_one_experiment_from_the_command_line_and_from_python(tmp_path):
    """The README's config, variants FSL (the top level as it is) and FedAvg: `loading.load` + `run_group` runs the
    runs `fedsl run` runs; `runner.run` runs one run and refuses the group in one line; a top level whose algorithm
    no variant runs (variants FedAvg alone under an FSL top level: `fedsl run` ran FedAvg only, Python FSL only) is
    refused in one line as the runs are made, naming the fix; `--variants` may still pick variants that do not run
    it."""
    from fedsl.config import loading
    from fedsl.config.expand import expand_variants, only_variants
    from fedsl.config.schema import ConfigError
    from fedsl.runs import runner
    from fedsl.sweeps.compare import run_group

    path = tmp_path / "my.toml"
    path.write_text(README_TOML + '[variants.FSL]\n[variants.FedAvg.algorithm]\nname = "fedavg"\n')
    cfg = loading.load(path)
    ends = run_group(cfg, tmp_path / "g", log=lambda s: None, progress=False)
    assert [(e["name"], e["algorithm"]) for e in ends] == [("FSL", "fsl"), ("FedAvg", "fedavg")]
    with pytest.raises(ConfigError, match=r"^config 'my-run' is a group of runs \(variants FSL, FedAvg\) and run\(\) "
                                          r"runs one: expected fedsl\.sweeps\.compare\.run_group\(cfg, out\)"):
        runner.run(cfg, tmp_path / "one")
    assert not (tmp_path / "one").exists()
    alone = runner.run(expand_variants(cfg)["FedAvg"], tmp_path / "one", log=lambda s: None, progress=False)
    assert alone["final_accuracy"] == ends[1]["final_accuracy"]  # the group's FedAvg run, run alone
    for extra, what in (("seeds = [0, 1]\n", "seeds = [0, 1]"),
                        ('[sweep]\n"algorithm.local_lr" = [0.01, 0.1]\n', "a sweep over algorithm.local_lr")):
        path.write_text(README_TOML.replace("rounds = 2\n", "rounds = 2\n" + extra) if "seeds" in extra
                        else README_TOML + extra)
        with pytest.raises(ConfigError, match=rf"is a group of runs \({re.escape(what)}\)"):
            runner.run(loading.load(path), tmp_path / "x")

    path.write_text(README_TOML + '[variants.FedAvg.algorithm]\nname = "fedavg"\n')
    with pytest.raises(ConfigError) as info:
        run_group(loading.load(path), tmp_path / "h")
    assert str(info.value) == (
        "algorithm.name = 'fsl' at the top level is run by no variant: the variant FedAvg sets its own algorithm.name "
        "(the top level is the variants' template, not a run): expected a variant that runs it, e.g. an empty "
        "[variants.fsl] table (the top level as it is), or the top level's algorithm.name set to one of theirs "
        "('fedavg')")
    assert not (tmp_path / "h").exists()
    path.write_text(README_TOML + '[variants.FSL]\n[variants.FedAvg.algorithm]\nname = "fedavg"\n')
    some = only_variants(loading.load(path), ["FedAvg"])
    assert list(expand_variants(some)) == ["FedAvg"] and some.algorithm.name == "fedavg"
