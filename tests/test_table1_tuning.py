"""The table1-cifar10-tuning preset is the paper's tuning grid for Table 1, stacked as a GPU runs it (no run here)."""

from pathlib import Path

from fedsl.config import loading, presets
from fedsl.config.expand import expand_runs
from fedsl.sweeps.compare import stack_groups

FSL_VARIANTS = ("FSL-250", "FSL-500", "FSLsyn-504", "FSLsyn-720")


def test_tuning_preset_is_the_papers_grid_at_table1s_cell():
    cfg = loading.load(base=presets.load("table1-cifar10-tuning"), overrides=["stack=64"])
    runs = {name: c for name, (_, c) in expand_runs(cfg).items()}
    assert len(runs) == 4 + 4 * 4 and {(c.seed, c.rounds) for c in runs.values()} == {(0, 1000)}
    feddyn = {c.algorithm.alpha for n, c in runs.items() if n.startswith("FedDyn-")}
    assert feddyn == {0.01, 0.05, 0.1, 0.5}  # FedDyn's alpha; its gamma pinned (no server learning)
    assert {(c.algorithm.local_lr, c.server.gamma) for n, c in runs.items() if n.startswith("FedDyn-")} == {(0.05, 1.0)}
    for v in FSL_VARIANTS:  # gamma for FSL and FSLsyn, at the eta_l of Fig. 5's best C = 2 cell
        mine = [c for n, c in runs.items() if n.startswith(v + "-gamma=")]
        assert sorted(c.server.gamma for c in mine) == [0.6, 0.8, 1.0, 1.2], v
        assert {(c.algorithm.name, c.algorithm.local_lr, c.data.classes_per_client) for c in mine} == {("fsl", 0.02, 2)}
    # Table 1's columns as table1-cifar10 runs them: at gamma = 1 and alpha = 0.01 the same runs
    table1 = {n: c for n, (_, c) in expand_runs(loading.load(base=presets.load("table1-cifar10"))).items()}
    for v in (*FSL_VARIANTS, "FedDyn"):
        mine = runs[f"{v}-gamma=1-seed0" if v != "FedDyn" else "FedDyn-alpha=0.01-seed0"]
        theirs = table1[f"{v}-seed0"]
        assert (mine.data, mine.algorithm, mine.server, mine.eval_every) == \
            (theirs.data, theirs.algorithm, theirs.server, theirs.eval_every), v
    # a stack shares the clients' step: the 16 FSL/FSLsyn runs are one stack, each FedDyn alpha its own
    groups = stack_groups(runs, Path("/nonexistent"), resume=False)
    assert sorted(len(g) for g in groups) == [1, 1, 1, 1, 16]
