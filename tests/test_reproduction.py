"""REPRODUCTION.md's summary table is what reproduction/ computes, and reproduction/collect.py keeps what it needs."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from conftest import tiny_config

from fedsl.config import schema as C
from fedsl.report import verdicts
from fedsl.report.tables import write_index
from fedsl.sweeps.compare import run_group

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "reproduction" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_reproduction_md_summary_is_recomputed_from_reproduction():
    """Every number and verdict of the summary table, re-computed from the committed files."""
    summary = _module("summary")
    text = summary.record()  # REPRODUCTION.md and the experiments' pages
    for i, table in enumerate(summary.tables()):  # summary, cost, Table 1, Fig. 5, Table 1's claims
        assert summary.in_doc(text, i) == table, "run: python reproduction/summary.py --write"


def test_every_summary_row_cites_its_folders_and_fig5_the_full_scale_one():
    """A reader goes from a row to its files: each row's scale cell names every folder it was read from, and
    Fig. 5's row reads the full-scale GPU grid (not the superseded 200-round or old-defaults folders)."""
    import tomllib

    summary = _module("summary")
    entries = tomllib.loads((ROOT / "reproduction" / "summary.toml").read_text())["row"]
    rows = [line for line in summary.in_doc(summary.DOC.read_text(), 0).splitlines()[2:]]
    assert len(rows) == len(entries)
    for entry, line in zip(entries, rows):
        scale_cell = line.split(" | ")[1]
        assert line.startswith(f"| [{entry['paper']}](reproduction/pages/{entry['page']}.md)<br>")
        assert (ROOT / "reproduction" / "pages" / f"{entry['page']}.md").is_file()
        assert all(f"`{folder}`: " in scale_cell for folder in entry["folders"]), (entry["paper"], scale_cell)
    fig5 = next(line for e, line in zip(entries, rows) if e["preset"] == "fig5-cifar10")
    assert fig5.split(" | ")[1].startswith(f"`{summary.FIG5}`: 1,000 × ")


def test_collect_keeps_the_text_results_of_finished_runs(tmp_path):
    cfg = C.validate(tiny_config(rounds=2, seeds=[0, 1], variants={"A": {}, "B": {"algorithm": {"name": "fedavg"}}},
                                 claims=[{"text": "A beats B", "better": "A", "worse": "B"}]))
    run_group(cfg, tmp_path / "g", log=lambda s: None, progress=False)
    out = tmp_path / "kept"
    names = _module("collect").collect(tmp_path / "g", out)
    assert sorted(names) == ["A-seed0", "A-seed1", "B-seed0", "B-seed1"]
    assert sorted(p.name for p in (out / "A-seed0").iterdir()) == ["metrics.csv", "summary.json"]
    assert (out / "index.csv").read_text().count("completed") == 4
    # the kept folder judges the same as the original
    a, b = verdicts.judge_group(tmp_path / "g"), verdicts.judge_group(out)
    assert [v.line() for _, vs in a for v in vs] == [v.line() for _, vs in b for v in vs]
    assert json.loads((out / "group.json").read_text())["claims"][0]["better"] == "A"
    # a kept folder whose run had not finished (here: removed) resumes on another machine: the finished runs
    # are skipped and the missing one runs again from scratch, into the same numbers
    shutil.rmtree(out / "B-seed1")
    write_index(out)
    assert "pending" in (out / "index.csv").read_text()
    run_group(C.validate(json.loads((out / "group.json").read_text())["config"]), out, resume=True,
              log=lambda s: None, progress=False)
    assert (out / "B-seed1" / "metrics.csv").read_text().splitlines()[-1].split(",")[:4] == \
        (tmp_path / "g" / "B-seed1" / "metrics.csv").read_text().splitlines()[-1].split(",")[:4]
    assert (out / "A-seed0" / "metrics.csv").read_text() == (tmp_path / "g" / "A-seed0" / "metrics.csv").read_text()


def test_collect_keeps_a_running_studys_text_and_a_consistent_database(tmp_path):
    """`fedsl run --tuned` still in its studies (no group.json): collect copies tune/'s text files, never a
    checkpoint, and study.db as its last commit, although a writer holds a transaction open; then the group's
    runs too once group.json exists."""
    import sqlite3
    import subprocess

    tune = tmp_path / "g" / "tune"
    trial = tune / "FSL" / "trial-0000"
    trial.mkdir(parents=True)
    for name in ("config.json", "metrics.csv", "summary.json", "checkpoint.pt"):
        (trial / name).write_text(name)
    (tune / "tune.json").write_text("{}")
    db = sqlite3.connect(tune / "study.db")
    db.execute("CREATE TABLE trials (number INTEGER)")
    db.execute("INSERT INTO trials VALUES (0)")
    db.commit()
    db.execute("INSERT INTO trials VALUES (1)")  # uncommitted: a trial being recorded at the copy
    collect = _module("collect")
    try:
        assert collect.collect(tmp_path / "g", tmp_path / "kept") == []
    finally:
        db.close()
    kept = tmp_path / "kept" / "tune"
    assert sorted(p.name for p in (kept / "FSL" / "trial-0000").iterdir()) == ["config.json", "metrics.csv",
                                                                               "summary.json"]
    copy = sqlite3.connect(kept / "study.db")
    assert copy.execute("SELECT number FROM trials").fetchall() == [(0,)]
    copy.close()
    assert not (tmp_path / "kept" / "group.json").exists()
    r = subprocess.run([sys.executable, str(ROOT / "reproduction" / "collect.py"), str(tmp_path / "nothing"),
                        str(tmp_path / "k2")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "expected a run group's folder" in r.stderr
    assert not (tmp_path / "k2").exists()


def test_a_diverged_run_neither_sets_the_scale_nor_joins_the_mean(tmp_path):
    """A run that diverged at round 10 stops there by definition: the group's scale is its completed runs'
    rounds, and the variant's mean is over its completed seeds, with the diverged ones counted beside it."""
    import json

    from fedsl.report import summary

    rows = ["run,variant,seed,status,final_accuracy,rise_time,T_0.5,rounds_done,wall_time",
            "A-seed0,A,0,completed,0.50,10,20,200,1", "A-seed1,A,1,completed,0.60,10,20,200,1",
            "B-seed0,B,0,completed,0.30,,,200,1", "B-seed1,B,1,diverged,nan,,,10,1"]
    (tmp_path / "index.csv").write_text("\n".join(rows) + "\n")
    runs = {f"{v}-seed{s}": {"dir": f"{v}-seed{s}", "variant": v, "base": v, "seed": s, "params": {}}
            for v in "AB" for s in (0, 1)}
    (tmp_path / "group.json").write_text(json.dumps({"runs": runs}))
    assert summary._rounds_done(tmp_path) == [200, 200, 200]
    assert summary.our_numbers(tmp_path) == "A 0.550 ± 0.071 (20); B 0.300, 1 of 2 diverged (—)"


def test_the_robustness_table_takes_label_flippings_f0_from_sign_flipping(tmp_path):
    """One row per defence, mean ± sample std over the seeds, label flipping's f = 0 column = sign flipping's runs
    (nobody attacks at f = 0), diverged seeds counted, unfinished cells shown as '…', rows only for the defences
    the folder has runs of (in DEFENCES' order: median-b2 after median, no trimmed mean)."""
    rows = ["run,variant,seed,attack.fraction,status,final_accuracy,rise_time,T_0.5,rounds_done,wall_time"]
    for variant, f, seed, status, acc in [("signflip-FedAvg", 0.0, 0, "completed", 0.6),
                                          ("signflip-FedAvg", 0.0, 1, "completed", 0.7),
                                          ("labelflip-FLTrust+SL", 0.4, 0, "diverged", 0.1),
                                          ("labelflip-FLTrust+SL", 0.4, 1, "completed", 0.5),
                                          ("signflip-median", 0.1, 0, "running", 0.3),
                                          ("signflip-Krum", 0.4, 0, "diverged", "nan"),
                                          ("signflip-Krum", 0.4, 1, "diverged", "nan"),
                                          ("signflip-Krum", 0.2, 0, "diverged", "nan"),
                                          ("signflip-Krum", 0.2, 1, "completed", 0.02),
                                          ("signflip-median-b2", 0.0, 0, "completed", 0.25)]:
        name = f"{variant}-fraction={f:g}"
        rows.append(f"{name}-seed{seed},{name},{seed},{f},{status},{acc},,,200,1.0")
    (tmp_path / "index.csv").write_text("\n".join(rows) + "\n")
    lines = _module("robustness_table").table(tmp_path).splitlines()
    assert lines[0].startswith("| defence | sign flip, f = 0 | sign flip, f = 0.1 |")
    fedavg = lines[2].split(" | ")
    assert fedavg[1] == fedavg[5] == "0.650 ± 0.071" and fedavg[2] == "…"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| FedAvg", "| median", "| median-b2", "| Krum",
                                                           "| FLTrust+SL"]
    assert lines[6].split(" | ")[-1] == "0.300 ± 0.283 (1 div.) |"
    assert lines[3].split(" | ")[2] == "…"  # median at f = 0.1: still running
    assert lines[4].split(" | ")[1] == "0.250 (1 seed)"
    krum = lines[5].split(" | ")
    assert krum[3] == "0.020 (1 seed) (1 div.)" and krum[4] == "diverged (2)"  # NaN: diverged before any score


def test_a_grid_cell_of_runs_that_diverged_before_any_score_joins_no_range(tmp_path):
    """robustness-emnist's Krum: a run that diverged at round 10 has final accuracy NaN; the summary's per-method
    range over the grid's cells skips it (it read 'nan–nan' before), and a method with no score says so."""
    rows, runs = ["run,variant,seed,f,status,final_accuracy,rise_time,T_0.5,rounds_done,wall_time"], {}
    for method, accs in (("A", ["0.5", "0.6", "nan"]), ("B", ["nan"] * 3), ("C", ["0.1", "0.2", "0.3"])):
        for f, acc in zip((0.1, 0.2, 0.4), accs):
            name = f"{method}-f={f}"
            status = "diverged" if acc == "nan" else "completed"
            rows.append(f"{name}-seed0,{name},0,{f},{status},{acc},,,200,1.0")
            runs[f"{name}-seed0"] = {"dir": f"{name}-seed0", "variant": name, "base": method, "seed": 0,
                                     "params": {"f": f}}
    (tmp_path / "index.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "group.json").write_text(json.dumps({"runs": runs}))
    from fedsl.report.summary import our_numbers
    text = our_numbers(tmp_path)
    assert text == "A 0.500–0.600 over 2 cells; B: no score in any cell; C 0.100–0.300 over 3 cells", text
