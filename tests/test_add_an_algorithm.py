"""docs/how-to/add-an-algorithm.md's rule, as copied from the page: it registers beside the built-in rules, its
server step is its formula's, and it runs in the simulator alone and with server learning. A rule whose setting
would change a built-in rule's default is refused when the registry is made."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

import fedsl.algorithms
from fedsl.algorithms import SPECS, FedAvgM, HyperParam, RoundContext, Spec
from fedsl.algorithms.spec import registry

PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "add-an-algorithm.md"
NAME = "fednesterov"  # the page's rule


def _page_module() -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S) if "\nSPEC = " in b]
    assert len(blocks) == 1, "the page shows one complete rule module"
    return blocks[0]


@pytest.fixture
def rule(monkeypatch):
    """The page's module block as the module it says it is (``fedsl.algorithms.fednesterov``), its SPEC checked by
    ``registry`` with every built-in spec and added to ``SPECS`` for the test; or, where a reader has followed the
    page (the module in the tree and registered), that module."""
    if NAME in SPECS:
        import importlib
        module = importlib.import_module(f"fedsl.algorithms.{NAME}")
        assert SPECS[NAME] is module.SPEC
        return module
    module = types.ModuleType(f"fedsl.algorithms.{NAME}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(_page_module(), str(PAGE), "exec"), module.__dict__)  # noqa: S102 - the repository's own documentation
    spec = module.SPEC
    assert spec.name == NAME and NAME not in SPECS
    assert registry((*SPECS.values(), spec))[NAME] is spec  # its key collides with no built-in rule's
    monkeypatch.setitem(SPECS, NAME, spec)
    return module


def test_its_server_step_and_state_are_its_formula_by_hand(rule):
    """v_t = β_N v_{t-1} + Δ_t, x̄ = x + η_g (β_N v_t + Δ_t), two steps from v_0 = 0 on numbers exact in binary:
    β_N = 0.5, η_g = 2; Δ_1 = mean([1, 0], [-1, 2]) = [0, 1], then Δ_2 = mean([0, 0], [0, 1]) = [0, 0.5]."""
    r = fedsl.algorithms.make_rule(NAME, 2.0, nesterov_momentum=0.5)
    assert type(r) is rule.FedNesterov and r.nesterov_momentum == 0.5 and r.global_lr == 2.0
    assert fedsl.algorithms.make_rule(NAME, 1.0).nesterov_momentum == 0.9  # the spec's default
    half = torch.tensor([0.5, 0.5], dtype=torch.float64)
    ctx = RoundContext(local_lr=0.1, steps=torch.tensor([1, 1]), num_clients=2)
    x = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    state = r.init_server_state(x)
    assert state["v"]["w"].tolist() == [0.0, 0.0]
    finals = {"w": torch.tensor([[2.0, -2.0], [0.0, 0.0]], dtype=torch.float64)}
    x, state = r.server_update(x, state, finals, half, ctx)
    assert state["v"]["w"].tolist() == [0.0, 1.0]            # 0.5·0 + [0, 1]
    assert x["w"].tolist() == [1.0, 1.0]                     # [1, -2] + 2·(0.5·[0, 1] + [0, 1])
    finals = {"w": torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=torch.float64)}
    x, state = r.server_update(x, state, finals, half, ctx)
    assert state["v"]["w"].tolist() == [0.0, 1.0]            # 0.5·[0, 1] + [0, 0.5]
    assert x["w"].tolist() == [1.0, 3.0]                     # [1, 1] + 2·(0.5·[0, 1] + [0, 0.5])


def _simulator(algorithm, fm, fed):
    from fedsl import Simulator, make_executor
    return Simulator(fm, fed, algorithm, make_executor("sequential", fm, torch.device("cpu")), clients_per_round=5,
                     seed=0)


@pytest.fixture
def federation():
    """The Python API tutorial's federation (10 clients of 2 font-rendered digits each, D0 of 50), in float64, and
    a seeded MLP: both simulators below start from the same x_0."""
    from torch import nn

    from fedsl import Federation, FunctionalModel
    from fedsl.data.datasets import channel_stats, to_tensor
    from fedsl.data.partition import by_classes
    from fedsl.data.server_data import iid_per_class
    from fedsl.sources.synthetic import synthetic_chars

    ds = synthetic_chars("0123456789", train_per_class=100, test_per_class=50)
    train, test = ds.train, ds.test
    clients = by_classes(train.y, num_clients=10, classes_per_client=2, samples_per_client=100, seed=0)
    stats = channel_stats(train.x)
    fed = Federation(to_tensor(train.x, stats).double(), torch.from_numpy(train.y), clients,
                     iid_per_class(train.y, size=50, seed=0), to_tensor(test.x, stats).double(),
                     torch.from_numpy(test.y), 10, ds.class_names)
    torch.manual_seed(0)
    fm = FunctionalModel(nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)).double())
    return fm, fed


def test_it_runs_in_the_simulator_and_with_server_learning(rule, federation, one_thread):
    """Round 1 from v_0 = 0 moves x_0 by η_g (1 + β_N) Δ_0: (1 + β_N) times FedAvg's move from the same x_0 with
    the same clients and batches (to float64 rounding). With server learning after it (FSL's line 10) and beside
    it (FSL-p: its spec says parallel_ok), it learns the digits."""
    from fedsl import LocalTraining, ServerLearning, make_algorithm

    fm, fed = federation
    local = LocalTraining(lr=0.05, batch_size=20)
    mine = _simulator(make_algorithm(NAME, local, 1.0, None, nesterov_momentum=0.5), fm, fed)
    plain = _simulator(make_algorithm("fedavg", local, 1.0, None), fm, fed)
    x0 = {n: p.clone() for n, p in mine.initial_state().x.items()}
    x1 = mine.round(mine.initial_state(), 0)[0].x
    y1 = plain.round(plain.initial_state(), 0)[0].x
    assert x0.keys() == x1.keys() == y1.keys()
    for n in x0:
        moved, fedavg_moved = x1[n] - x0[n], y1[n] - x0[n]
        assert fedavg_moved.abs().max() > 1e-3, n  # the round moved the model
        torch.testing.assert_close(moved, 1.5 * fedavg_moved, rtol=0, atol=1e-12)
    for mode in ("incremental", "parallel"):
        server = ServerLearning(gamma=1.0, lr=0.1, batch_size=20, epochs=1, mode=mode)
        sim = _simulator(make_algorithm(NAME, local, 1.0, server), fm, fed)
        state = sim.initial_state()
        for t in range(10):
            state, _ = sim.round(state, t)
        accuracy, loss = sim.evaluate(state.x)
        assert accuracy > 0.5 and loss == loss, (mode, accuracy, loss)  # 10 classes: chance is 0.1


def test_a_rule_that_redeclares_a_built_in_key_is_refused_in_one_line():
    """A rule declaring ``momentum`` with its own default would change FedAvgM's β in every config that leaves it
    unset (one ``[algorithm]`` field per key): the registry refuses it, naming both rules and the way out. A rule
    that declares the very same setting is accepted, and FedAvgM's default stays 0.9."""
    from fedsl.config.schema import AlgorithmConfig

    beta = SPECS["fedavgm"].hyperparams[0]
    assert beta.key == "momentum" and beta.default == 0.9
    mine = Spec("mine", FedAvgM, (HyperParam("momentum", 0.5, "β", "FedAvgM server momentum", ge=0, lt=1),))
    with pytest.raises(ValueError) as e:
        registry((*SPECS.values(), mine))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("algorithm 'mine' declares algorithm.momentum as β = 0.5"), msg
    assert "'fedavgm' declares it as β = 0.9" in msg and "(e.g. mine_momentum)" in msg, msg
    with pytest.raises(ValueError, match="^algorithm 'fedavg' is declared twice"):
        registry((*SPECS.values(), Spec("fedavg", FedAvgM)))
    same = Spec("mine", FedAvgM, (beta,), global_lr=1.0)
    assert registry((*SPECS.values(), same))["mine"] is same
    assert AlgorithmConfig.model_fields["momentum"].default == 0.9


@pytest.mark.slow
def test_the_pages_steps_applied_to_a_copy_of_the_tree_pass_the_tests_it_names(tmp_path):
    """A reader's path through the page: the module written to ``src/fedsl/algorithms/fednesterov.py``, the page's
    diffs applied to ``__init__.py`` as they read (each one's '-' and context lines found exactly once in today's
    file), then the tests the page names run on that tree and pass, the new rule among the built-in ones."""
    import shutil
    import subprocess

    if NAME in SPECS:
        pytest.skip("this tree holds the page's rule already (this test, run inside the copy it makes)")
    root = PAGE.parents[2]
    for part in ("src", "tests"):
        shutil.copytree(root / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs" / "how-to").mkdir(parents=True)
    shutil.copy(PAGE, tmp_path / "docs" / "how-to" / PAGE.name)
    shutil.copy(root / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "src" / "fedsl" / "algorithms" / f"{NAME}.py").write_text(_page_module())
    init = tmp_path / "src" / "fedsl" / "algorithms" / "__init__.py"
    text = init.read_text()
    diffs = re.findall(r"```diff\n(.*?)```", PAGE.read_text(), re.S)
    assert len(diffs) == 2, "the page's steps: two places in __init__.py"
    for diff in diffs:
        lines = diff.splitlines()
        old = "".join(line[1:] + "\n" for line in lines if line[:1] in (" ", "-"))
        new = "".join(line[1:] + "\n" for line in lines if line[:1] in (" ", "+"))
        assert text.count(old) == 1, f"the page's diff does not apply to today's __init__.py:\n{diff}"
        text = text.replace(old, new)
    init.write_text(text)
    named = re.search(r"\.venv/bin/python -m pytest -n0 (tests/\S+(?: tests/\S+)*)", PAGE.read_text())
    assert named, "the page names the tests to run"
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider",
                           *named.group(1).split()], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    check = subprocess.run([sys.executable, "-c", "from fedsl.algorithms import SPECS; import fedsl; "
                            f"print(fedsl.__file__, '{NAME}' in SPECS)"], env=env, capture_output=True, text=True)
    assert check.stdout.split() == [str(tmp_path / "src" / "fedsl" / "__init__.py"), "True"], check
