"""REPRODUCTION.md's summary table is what reproduction/ computes, and reproduction/collect.py keeps what it needs."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from conftest import tiny_config

from fedsl.experiments import config as C
from fedsl.experiments.compare import run_group
from fedsl.report import verdicts
from fedsl.report.tables import write_index

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
    text = summary.DOC.read_text()
    for i, table in enumerate(summary.tables()):  # summary, cost, Table 1 at full scale
        assert summary.in_doc(text, i) == table, "run: python reproduction/summary.py --write"


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
