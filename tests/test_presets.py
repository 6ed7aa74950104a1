"""Every preset has a --quick form that runs (on the offline copies in ../shared/data) and reports."""

import json

import pytest

from fedsl.cli import main
from fedsl.config import loading, presets

PAPER = [n for n in presets.names() if n.startswith(("fig", "table", "appendix", "scenario"))]
# beyond the paper, on its data, at cross-device scale (generated: its quick form about 4 CPU-s) and on text
BEYOND = [n for n in presets.names() if n.startswith(("rivals", "availability", "robustness", "privacy",
                                                       "cross-device", "serverdata", "shakespeare"))]


def test_paper_presets_name_their_figure_and_have_quick_forms():
    assert {"fig2-cifar10", "fig2-emnist", "fig3-cifar10", "fig3-emnist", "fig5-cifar10", "fig5-emnist",
            "table1-cifar10", "appendix-no-pretrain", "appendix-fslp", "appendix-diagnostics"} <= set(PAPER)
    for name in presets.names():
        raw = presets.load(name)
        assert raw.get("quick"), f"{name} has no [quick] table"
        cfg = loading.load(base=raw, quick=True)
        assert cfg.rounds <= 3 and len(cfg.seeds) <= 1
        if name in PAPER:
            assert raw["description"].startswith("Paper")
        if name.startswith(("fig", "table", "appendix")):
            assert raw.get("paper_claims") or raw.get("paper"), f"{name} states nothing of the paper's results"
    table1 = loading.load(base=presets.load("table1-cifar10"))
    assert table1.paper["FSL-500"] == {"final_accuracy": 0.6144, "T_0.5": 203}


# Every quick form runs in CI, at the smallest size that still runs each of its variants and the report: a
# class-balanced test subset (data.test_size: 500 CIFAR-10 images, 5 per EMNIST class) evaluated at x_0 and after
# the last round only, few clients per round with two local steps each, and small server sets (FSLsyn's too).
@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER + BEYOND)
def test_quick_form_runs_and_reports(name, shared_data, tmp_path, capsys):
    out = tmp_path / name
    assert main(["run", "--preset", name, "--quick", "--data-dir", str(shared_data), "--out", str(out), "--quiet"]) == 0
    runs = json.loads((out / "group.json").read_text())["runs"]
    for r in runs:
        assert json.loads((out / r / "summary.json").read_text())["status"] == "completed", r
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "report.md").is_file()
