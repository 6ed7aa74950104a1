"""Fig. 5 read from a grid of runs (fedsl.report.grid), the heat maps, and reproduction/merge.py, on hand-made
grids whose numbers are worked out by hand in each docstring."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

from fedsl.config import schema as C
from fedsl.report import grid
from fedsl.report.verdicts import RunValue

ROOT = Path(__file__).resolve().parents[1]
LR, CPC = grid.ROW, grid.COL

# A: column C = 1 is best at η_l = 0.01 (0.5 vs 0.3), column C = 2 at η_l = 0.1 (0.7 vs 0.6); B is flat in η_l
A = {(0.01, 1): 0.5, (0.1, 1): 0.3, (0.01, 2): 0.6, (0.1, 2): 0.7}
B = {(0.01, 1): 0.5, (0.1, 1): 0.5, (0.01, 2): 0.6, (0.1, 2): 0.6}


def runs_of(table: dict, base: str, spread: float = 0.0, seeds=(0,)) -> list[RunValue]:
    """One RunValue per seed and cell; with two seeds, the cell's value ∓ ``spread``."""
    out = []
    for (lr, c), acc in table.items():
        for k, s in enumerate(seeds):
            shift = 0.0 if len(seeds) == 1 else (-spread if k == 0 else spread)
            out.append(RunValue(base, s, {LR: lr, CPC: c}, {"final_accuracy": acc + shift}))
    return out


def claim(better="B", worse="A", **kw):
    return C.Claim.model_validate({"text": f"{better} beats {worse}", "better": better, "worse": worse, **kw})


def test_cells_keep_a_cell_whose_run_has_no_score():
    runs = runs_of(A, "A") + [RunValue("A", 1, {LR: 0.01, CPC: 1}, {"final_accuracy": 0.7}),
                              RunValue("S", 0, {LR: 0.1, CPC: 1}, {})]  # diverged before any evaluation
    g = grid.cells(runs)
    assert g["A"][(0.01, 1)] == [0.5, 0.7] and g["A"][(0.1, 2)] == [0.7]
    assert g["S"] == {(0.1, 1): []}


def test_best_rows_take_the_highest_mean_ties_to_the_smaller_row_and_the_floor_for_no_score():
    assert grid.best_rows({k: [v] for k, v in A.items()}) == {1: (0.01, 0.5), 2: (0.1, 0.7)}
    assert grid.best_rows({k: [v] for k, v in B.items()}) == {1: (0.01, 0.5), 2: (0.01, 0.6)}  # ties
    # a cell with no score counts as the floor: 0.2 is below 0.3, 0.4 above it
    assert grid.best_rows({(0.01, 1): [], (0.1, 1): [0.3]}, floor=0.2) == {1: (0.1, 0.3)}
    assert grid.best_rows({(0.01, 1): [], (0.1, 1): [0.3]}, floor=0.4) == {1: (0.01, 0.4)}


def test_the_loss_of_a_fixed_learning_rate_by_hand():
    """A: losses (0.01, 1) = 0, (0.1, 1) = 0.2, (0.01, 2) = 0.1, (0.1, 2) = 0. Largest per η_l: 0.1 and 0.2, so
    the fixed η_l is 0.01 (it loses 0.1 at C = 2); means 0.05 and 0.1; G = mean(0.1, 0.05) = 0.075. Weights
    (|C| = 2, R = 2): +0.25 at a column's best cell, −0.25 at the other; Σ w·acc = 0.125 − 0.075 + 0.175 −
    0.15 = 0.075 = G."""
    lo = grid.lr_loss({k: [v] for k, v in A.items()}, floor=0.1)
    assert lo.loss == pytest.approx({(0.01, 1): 0.0, (0.1, 1): 0.2, (0.01, 2): 0.1, (0.1, 2): 0.0})
    assert lo.row_max == pytest.approx({0.01: 0.1, 0.1: 0.2}) and lo.row_mean == pytest.approx({0.01: 0.05, 0.1: 0.1})
    assert lo.fixed == 0.01 and lo.fixed_loss == pytest.approx(0.1) and lo.mean == pytest.approx(0.075)
    assert lo.weights == pytest.approx({(0.01, 1): 0.25, (0.1, 1): -0.25, (0.01, 2): -0.25, (0.1, 2): 0.25})
    assert sum(w * A[k] for k, w in lo.weights.items()) == pytest.approx(lo.mean)
    flat = grid.lr_loss({k: [v] for k, v in B.items()}, floor=0.1)
    assert flat.mean == 0 and flat.fixed_loss == 0 and flat.fixed == 0.01
    # a diverged cell (no score) at chance 0.1: loses 0.5 − 0.1 = 0.4 at C = 1, and G = mean(0.2, 0.05) = 0.125
    gone = grid.lr_loss({**{k: [v] for k, v in A.items()}, (0.1, 1): []}, floor=0.1)
    assert gone.loss[(0.1, 1)] == pytest.approx(0.4) and gone.mean == pytest.approx(0.125)


def test_g_compared_against_the_seed_std_and_the_pooled_within_cell_std():
    """G_A − G_B = 0.075 − 0 = 0.075. One seed, σ = 0.01 over 3 seeds: Σw² = 4 · 0.0625 = 0.25 a side, so
    SE = 0.01·√0.5 = 0.00707, t = 10.61 on 2 df. Two seeds a cell at ∓0.01: each cell's sample variance is
    0.0002, pooled σ = 0.01414 on 8 df, SE = 0.01414·√(0.25/2 + 0.25/2) = 0.00707 again, t = 10.61 on 8 df."""
    one = grid.cells(runs_of(A, "A") + runs_of(B, "B"))
    v = grid.compare_lr_loss(claim(seed_std=0.01, seed_std_seeds=3), one, floor=0.1)
    assert v.means == pytest.approx((0.0, 0.075)) and v.diff == pytest.approx(0.075)
    assert v.se == pytest.approx(0.01 * math.sqrt(0.5)) and v.df == 2
    assert v.p == pytest.approx(stats.t.sf(0.075 / (0.01 * math.sqrt(0.5)), 2)) and v.verdict == "holds"
    assert grid.compare_lr_loss(claim("A", "B", seed_std=0.01), one, floor=0.1).verdict == "contradicted"
    assert grid.compare_lr_loss(claim(), one, floor=0.1).verdict == "not shown"  # one seed, no σ measured
    two = grid.cells(runs_of(A, "A", 0.01, (0, 1)) + runs_of(B, "B", 0.01, (0, 1)))
    v = grid.compare_lr_loss(claim(), two, floor=0.1)
    assert v.se == pytest.approx(math.sqrt(0.0002) * math.sqrt(0.25)) and v.df == 8
    assert "pooled within-cell std 0.0141" in v.test and v.verdict == "holds"
    # a cell with no score is a constant: it adds nothing to the SE (Σw² = 0.1875 for A)
    gone = grid.cells([r for r in runs_of(A, "A") if r.params != {LR: 0.1, CPC: 1}] + runs_of(B, "B")
                      + [RunValue("A", 0, {LR: 0.1, CPC: 1}, {})])
    v = grid.compare_lr_loss(claim(seed_std=0.01), gone, floor=0.1)
    assert v.diff == pytest.approx(0.125) and v.se == pytest.approx(0.01 * math.sqrt(0.1875 + 0.25))


def test_a_claim_judged_at_each_sides_best_learning_rate():
    """C = 1: B's best is 0.5 (η_l 0.01, a tie), A's 0.5 (0.01): d = 0. C = 2: B's best 0.6 (0.01) against A's
    0.7 (0.1): d = −0.1, t = −0.1 / (0.01·√2) on 2 df, contradicted."""
    runs = runs_of(A, "A") + runs_of(B, "B")
    vs = {v.cell[CPC]: v for v in grid.judge_at_best(claim(seed_std=0.01), runs)}
    assert vs[1].diff == pytest.approx(0.0) and vs[1].verdict == "not shown"
    assert vs[1].cell == {CPC: 1, LR: "0.01 vs 0.01"}
    assert vs[2].diff == pytest.approx(-0.1) and vs[2].cell[LR] == "0.01 vs 0.1" and vs[2].verdict == "contradicted"
    assert vs[2].p == pytest.approx(stats.t.sf(-0.1 / (0.01 * math.sqrt(2)), 2))


def write_group(path: Path, tables: dict[str, dict], diverged=(), claims=(), variants=None, seeds=(0,)) -> Path:
    """A collected group by hand: group.json, each run's summary.json (and a metrics.csv), index.csv."""
    from fedsl.report.tables import write_index

    runs = {}
    for base, table in tables.items():
        for (lr, c), acc in table.items():
            for s in seeds:
                variant = f"{base}-local_lr={lr}-classes_per_client={c}"
                name = f"{variant}-seed{s}"
                runs[name] = {"dir": name, "variant": variant, "base": base, "seed": s,
                              "params": {LR: lr, CPC: c}}
                gone = (base, lr, c) in diverged
                (path / name).mkdir(parents=True)
                (path / name / "summary.json").write_text(json.dumps({
                    "status": "diverged" if gone else "completed", "final_accuracy": acc, "T_0.5": None,
                    "rise_time": 10, "rounds_done": 30 if gone else 100, "wall_time": 1.0,
                    "test_data": {"size": 100, "class_histogram": [10] * 10}}))
                (path / name / "metrics.csv").write_text(f"round,accuracy\n100,{acc}\n")
    config = {"variants": variants if variants is not None else {b: {} for b in tables}, "seeds": list(seeds),
              "rounds": 100}
    (path / "group.json").write_text(json.dumps({
        "name": "g", "window": 20, "runs": runs, "sweep": [LR, CPC], "claims": [c.model_dump() for c in claims],
        "config": config}))
    write_index(path)
    return path


def test_the_fig5_tables_of_a_hand_made_group(tmp_path):
    """The Markdown block over A and B (as above; A's cell (0.1, 2) diverged at its last accuracy 0.7): the
    accuracy table marks best cells and the diverged one, the claims are judged per cell and at the best η_l,
    and G is compared for B (the method said to be easy to tune) against A."""
    g = write_group(tmp_path / "g", {"B": B, "A": A}, diverged={("A", 0.1, 2)},
                    claims=[claim(seed_std=0.01, seed_std_seeds=3)])
    text = grid.markdown(g, easy=("B",))
    lines = text.splitlines()
    assert "| B | 0.01 | **0.500** | **0.600** |" in lines and "| A | 0.1 | 0.300 | **0.700†** |" in lines
    # t = 0.2 / (0.01·√2) = 14.1 and −0.1 / (0.01·√2) = −7.1 on 2 df: p = 0.0025 and 0.990
    assert "| B vs A | 0.1 | +0.200, p = 0.002: **holds** | -0.100, p = 0.990: **contradicted** |" in lines
    assert "| 2 | 0.600 (η_l = 0.01) | 0.700 (η_l = 0.1) |" in lines
    assert "| 0.01 | 0.000 / 0.000 | 0.100 / 0.050 |" in lines and "| G | 0.000 | 0.075 |" in lines
    assert "| fixed η_l: largest loss | 0.01: 0.000 | 0.01: 0.100 |" in lines
    assert ("| learning rates are easier to pick for B than for A | 0.000 | 0.075 | +0.075 ± 0.007 (SE), t against "
            "seed std 0.01, p = 0.004 | **holds** |") in lines
    assert "a cell with no score counts as chance (0.1)" in text and "(seed 0;" in text
    # no method said to be easy: no G comparison
    assert "learning rates are easier" not in grid.markdown(g)


def test_the_heat_maps_are_drawn_in_the_groups_order(tmp_path, monkeypatch):
    """One panel per method in the group's order (B before A, not sorted), a diverged cell marked '†'."""
    from fedsl.report import report

    g = write_group(tmp_path / "g", {"B": B, "A": A}, diverged={("A", 0.1, 2)})
    titles, texts = [], []
    real = report.plt.subplots

    def spy(*a, **kw):
        fig, axes = real(*a, **kw)
        for ax in axes[0]:
            monkeypatch.setattr(ax, "set_title", lambda t, _ax=ax, **k: titles.append(t))
            monkeypatch.setattr(ax, "text", lambda x, y, s, _ax=ax, **k: texts.append(s))
        return fig, axes

    monkeypatch.setattr(report.plt, "subplots", spy)
    png = report.write_heatmaps(g, tmp_path / "heat.png", "title")
    assert png.stat().st_size > 5_000 and titles == ["B", "A"]
    assert texts == ["0.500", "0.600", "0.500", "0.600", "0.500", "0.600", "0.300", "0.700†"]


def _merge():
    spec = importlib.util.spec_from_file_location("merge", ROOT / "reproduction" / "merge.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["merge"] = mod
    spec.loader.exec_module(mod)
    return mod.merge


def test_merge_joins_the_groups_of_one_config(tmp_path):
    """Two variants run as separate calls become one group: runs in the given order, the config's variants and
    seeds joined, the files copied, index.csv the rows of both; the same config is required, a run once."""
    merge = _merge()
    a = write_group(tmp_path / "a", {"B": B}, variants={"B": {"x": 1}})
    b = write_group(tmp_path / "b", {"A": A}, variants={"A": {"x": 2}}, seeds=(1,))
    names = merge(tmp_path / "m", [a, b])
    spec = json.loads((tmp_path / "m" / "group.json").read_text())
    assert names == list(spec["runs"]) and names[0].startswith("B-") and names[-1].startswith("A-")
    assert spec["config"]["variants"] == {"B": {"x": 1}, "A": {"x": 2}} and spec["config"]["seeds"] == [0, 1]
    index = (tmp_path / "m" / "index.csv").read_text().splitlines()
    assert len(index) == 9 and index[1:] == (a / "index.csv").read_text().splitlines()[1:] + \
        (b / "index.csv").read_text().splitlines()[1:]
    run = names[-1]
    assert (tmp_path / "m" / run / "metrics.csv").read_text() == (b / run / "metrics.csv").read_text()
    other = write_group(tmp_path / "c", {"A": A}, seeds=(2,))
    json.dump({**json.loads((other / "group.json").read_text()), "window": 30}, open(other / "group.json", "w"))
    with pytest.raises(SystemExit, match="not the same group as .*: window differs"):
        merge(tmp_path / "n", [a, other])
    with pytest.raises(SystemExit, match="in two of the groups"):
        merge(tmp_path / "n", [a, a])


def _edit_group(path: Path, algorithm: str, config: dict, **top) -> Path:
    """A hand-made group whose runs ran ``algorithm``, its config updated by ``config`` and its spec by ``top``."""
    spec = json.loads((path / "group.json").read_text())
    spec["config"].update(config)
    spec.update(top)
    (path / "group.json").write_text(json.dumps(spec))
    for run in spec["runs"].values():
        summary = json.loads((path / run["dir"] / "summary.json").read_text())
        (path / run["dir"] / "summary.json").write_text(json.dumps({**summary, "algorithm": algorithm}))
    return path


def test_merge_takes_a_preset_that_gained_variants(tmp_path):
    """A later group of a preset that gained variants (serverdata-cifar10's FedDUM beside its FedDF): the later
    description and claims, the first's settings that change no number, a key the first lacks from the later, and an
    algorithm's own key from the group whose runs read it; the same own key read by runs of both must agree."""
    merge = _merge()
    a = _edit_group(write_group(tmp_path / "a", {"B": B}), "feddf",
                    {"distill": {"lr": 1e-4, "steps": 10}, "algorithm": {"name": "fsl"}, "checkpoint_every": 20,
                     "data": {"data_dir": "/data", "dataset": "cifar10"}}, description="old")
    b = _edit_group(write_group(tmp_path / "b", {"A": A}, seeds=(1,)), "feddum",
                    {"distill": {"lr": 1e-3, "steps": 10000}, "algorithm": {"name": "fsl", "feddum_beta": 0.9},
                     "checkpoint_every": 10, "data": {"data_dir": "../data", "dataset": "cifar10"},
                     "tune": {"trials": 20}}, description="new", claims=[{"text": "A beats B"}])
    merge(tmp_path / "m", [a, b])
    spec = json.loads((tmp_path / "m" / "group.json").read_text())
    cfg = spec["config"]
    assert spec["description"] == "new" and spec["claims"] == [{"text": "A beats B"}]
    assert cfg["distill"] == {"lr": 1e-4, "steps": 10} and cfg["algorithm"] == {"name": "fsl", "feddum_beta": 0.9}
    assert cfg["checkpoint_every"] == 20 and cfg["data"]["data_dir"] == "/data" and cfg["tune"] == {"trials": 20}
    c = _edit_group(write_group(tmp_path / "c", {"A": A}, seeds=(2,)), "feddf",
                    {"distill": {"lr": 1e-3, "steps": 10}, "algorithm": {"name": "fsl"}})
    with pytest.raises(SystemExit, match=r"distill\.lr = 0\.0001 in the first group, 0\.001 in a later one, and runs "
                                         "of both read it"):
        merge(tmp_path / "n", [a, c])
    d = _edit_group(write_group(tmp_path / "d", {"A": A}, seeds=(2,)), "feddf", {"rounds": 60})
    with pytest.raises(SystemExit, match="config rounds = 100 in the first group, 60 in a later one"):
        merge(tmp_path / "n", [a, d])


def test_the_cost_table_reads_a_rows_cost_folder(tmp_path):
    """A row whose folders ran on a GPU names the CPU folder its seconds per round come from (2.0 s here)."""
    from fedsl.report.summary import cost_markdown

    for name, wall in (("gpu", 10.0), ("cpu", 200.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.csv").write_text("run,status,rounds_done,wall_time\n"
                                                    f"r,completed,100,{wall}\n")
    row = {"paper": "Fig. 5", "preset": "fig5-cifar10", "folders": ["gpu"], "cost_folder": "cpu"}
    line = cost_markdown(tmp_path, [row]).splitlines()[-1]
    assert line.startswith("| Fig. 5 | 240 | 2.00 (`cpu`) | 133 |")
    line = cost_markdown(tmp_path, [{k: v for k, v in row.items() if k != "cost_folder"}]).splitlines()[-1]
    assert "0.10 (`gpu`)" in line
