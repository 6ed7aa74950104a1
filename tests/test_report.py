"""fedsl report: figures and report.md for groups, sweeps (1 and 2 keys), diagnostics and paper numbers."""

import json

from test_runs import tiny

from fedsl.cli import main


def test_report_of_a_two_key_sweep_with_paper_numbers(tmp_path, capsys):
    top = ('diag_every = 2\npaper_claims = ["FSL converges faster than FedAvg"]\n'
           'paper = { "FSL-local_lr=0.05-gamma=1" = { final_accuracy = 0.6144, "T_0.5" = 203 } }\n')
    tables = ('\n[sweep]\n"algorithm.local_lr" = [0.02, 0.05]\n"server.gamma" = [0.5, 1.0]\n'
              '[variants.FSL.algorithm]\nname = "fsl"\n')
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(top + tiny(tmp_path, rounds=2).read_text() + tables)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "group.json").read_text())["sweep"] == ["algorithm.local_lr", "server.gamma"]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    rep = out / "report"
    for png in ("curves.png", "bars.png", "heatmap.png", "diagnostics.png"):
        assert (rep / png).stat().st_size > 5_000, png
    md = (rep / "report.md").read_text()
    assert "Ours next to the paper's" in md and "| FSL-local_lr=0.05-gamma=1 |" in md and "0.6144" in md
    assert "Paper: FSL converges faster than FedAvg" in md


def test_report_of_a_one_key_sweep_and_errors(tmp_path, capsys):
    cfg = tiny(tmp_path, rounds=2, extra='\n[sweep]\n"server.gamma" = [0.5, 1.0]\n')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "sweep.png").stat().st_size > 5_000
    assert not (out / "report" / "heatmap.png").exists()
    assert main(["report", str(tmp_path)]) == 2
    assert "group.json" in capsys.readouterr().err


def test_report_lines_layout_with_a_pinned_variant(tmp_path, monkeypatch):
    """The paper's Fig. 3: accuracy and rise time against γ, a line per η_l, DS a point at γ = 0."""
    from fedsl.report import report

    drawn = {}
    real = report._sweep_plot
    monkeypatch.setattr(report, "_sweep_plot", lambda points, keys, path: drawn.update(
        points=points, keys=keys) or real(points, keys, path))
    tables = ('\n[sweep]\n"server.gamma" = [0.5, 1.0]\n"algorithm.local_lr" = [0.02, 0.05]\n'
              '[variants.DS-S4]\nalgorithm = { name = "ds" }\nserver = { gamma = 0.0 }\n'
              '[variants.FSL-S4]\nalgorithm = { name = "fsl" }\n')
    cfg = tmp_path / "fig3.toml"
    cfg.write_text('plot = "lines"\n' + tiny(tmp_path, rounds=2).read_text() + tables)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    runs = json.loads((out / "group.json").read_text())["runs"]
    assert sorted(runs) == ["DS-S4-local_lr=0.02", "DS-S4-local_lr=0.05", "FSL-S4-gamma=0.5-local_lr=0.02",
                            "FSL-S4-gamma=0.5-local_lr=0.05", "FSL-S4-gamma=1-local_lr=0.02",
                            "FSL-S4-gamma=1-local_lr=0.05"]
    assert {r["base"] for r in runs.values()} == {"DS-S4", "FSL-S4"}
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "sweep.png").stat().st_size > 5_000 and not (out / "report" / "heatmap.png").exists()
    assert drawn["keys"] == ["server.gamma", "algorithm.local_lr"]
    assert {p["base"] for p in drawn["points"]} == {"DS-S4", "FSL-S4"}  # not cut at the first "-"
    ds = [p for p in drawn["points"] if p["base"] == "DS-S4"]
    assert len(ds) == 2 and {p["params"]["server.gamma"] for p in ds} == {0.0}


def test_methods_keep_their_colour_across_names():
    from fedsl.report.plots import METHOD_COLOURS, colours, method_of

    assert [method_of(n) for n in ("FSL-g0.5-classes_per_client=2", "FSL-p-classes_per_client=2", "FSLsyn-720",
                                   "DS-S4", "FL", "FedDyn-local_lr=0.05", "FedProx")] == \
        ["fsl", "fsl_p", "fslsyn", "ds", "fl", "feddyn", None]
    c = colours(["FL-C=2", "DS-C=2", "FSL-g1-C=2", "FSL-g2-C=2", "FedProx"])
    assert (c["FL-C=2"], c["DS-C=2"], c["FSL-g1-C=2"]) == (METHOD_COLOURS["fl"], METHOD_COLOURS["ds"],
                                                          METHOD_COLOURS["fsl"])
    assert len(set(c.values())) == 5  # FSL's second γ and FedProx get colours of their own


def test_many_curves_keep_the_best_and_say_so(tmp_path):
    from fedsl.report.plots import MAX_CURVES, accuracy_curves, select_curves

    curves = {f"run{i}": ([1, 2], [0.1, 0.2], [0.1, i / 100]) for i in range(30)}
    shown, note = select_curves(curves)
    assert len(shown) == MAX_CURVES and set(shown) == {f"run{i}" for i in range(30 - MAX_CURVES, 30)}
    assert list(shown) == [f"run{i}" for i in range(30 - MAX_CURVES, 30)]  # original order kept
    assert note == f"the best {MAX_CURVES} of 30 by final accuracy"
    few = dict(list(curves.items())[:3])
    assert select_curves(few) == (few, "")
    assert accuracy_curves(curves, tmp_path / "c.png", "t").stat().st_size > 0


# ----------------------------------------------------------------------------- honest reports (issue 17)

def test_quick_or_short_group_says_so_beside_the_paper_numbers(tmp_path, capsys):
    """2 rounds of a 40-round experiment next to the paper's numbers: every row says how long ours ran."""
    top = ('threads = 1\npaper_claims = ["FSL beats FedAvg"]\n'
           'paper = { tiny = { final_accuracy = 0.61, "T_0.5" = 203 }, gone = { final_accuracy = 0.5 } }\n')
    cfg = tmp_path / "paper.toml"
    cfg.write_text(top + tiny(tmp_path, rounds=40).read_text() + '\n[quick]\nrounds = 2\n"data.test_size" = 20\n')
    for args, note in ((["--quick"], "quick: 2 of 40 rounds"), (["--set", "rounds=3"], "shorter: 3 of 40 rounds")):
        out = tmp_path / args[0].strip("-")
        assert main(["run", str(cfg), "--out", str(out), "--quiet", *args]) == 0
        assert json.loads((out / "group.json").read_text())["config"]["paper_rounds"] == 40
        assert main(["report", str(out)]) == 0
        md = (out / "report" / "report.md").read_text().split("## Ours next to the paper's")[1]
        row = next(line for line in md.splitlines() if line.startswith("| tiny |"))
        assert "0.6100" in row and row.rstrip(" |").endswith(note), row
        if "quick" in note:
            assert "| tiny | not reached | 203 |" in row  # T_0.5 within 2 rounds: not reached, not "—"
        assert next(line for line in md.splitlines() if line.startswith("| gone |")).endswith("| did not run |")
        assert "**Not comparable" in md and f"- Paper: FSL beats FedAvg (ours: {note})" in md
        # the quick form evaluates a test subset, and says so; the full test set says nothing
        assert ("**Our accuracies are on 20 test samples**" in md) == ("quick" in note)
    capsys.readouterr()


def test_length_note():
    from fedsl.report.report import length_note

    assert length_note(1000, 1000, quick=False) == "" and length_note(5, None, quick=True) == ""
    assert length_note(2, 1000, quick=True) == "quick: 2 of 1,000 rounds"
    assert length_note(None, 1000, quick=False) == "did not run"


def test_bars_say_not_reached_and_draw_no_error_bars_for_one_seed():
    import math

    from matplotlib.container import BarContainer, ErrorbarContainer

    from fedsl.report.plots import plt
    from fedsl.report.report import bars_figure

    nan = (math.nan, math.nan)
    one = {"variant": "FedAvg", "seeds": 1, "final_accuracy": (0.1, 0.0), "rise_time": (2.0, 0.0), "T_0.5": nan}
    three = {"variant": "FSL", "seeds": 3, "final_accuracy": (0.5, 0.05), "rise_time": (3.0, 1.0),
             "T_0.5": (10.0, 2.0)}
    fig = bars_figure([one, three])
    acc, _, t05 = fig.axes
    bars = [c for c in t05.containers if isinstance(c, BarContainer)]
    assert [round(b.get_x() + b.get_width() / 2) for b in bars[0]] == [1]  # no zero-height bar for FedAvg
    assert [(t.get_text(), round(t.get_position()[0])) for t in t05.texts] == [("not reached", 0)]
    errs = [c for c in acc.containers if isinstance(c, ErrorbarContainer)]
    segments = errs[0].lines[2][0].get_segments() if len(errs) == 1 else []
    assert [round(seg[0][0]) for seg in segments] == [1]  # FSL's 3 seeds only
    plt.close(fig)
    fig = bars_figure([one, {**three, "seeds": 1}])
    assert not any(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)
    plt.close(fig)


def test_a_time_some_seeds_never_reached_says_k_of_n_in_tables_and_bars():
    """Seed 0 reached 0.5 at round 15, seed 1 never: the variant's T_0.5 is '15 (1 of 2 seeds)' in the tables, its
    bar hatched with '1 of 2' above it and no error bar; one no seed reached is 'not reached (0 of 2 seeds)' and
    no bar; one all seeds reached is its mean ± std as before."""
    from matplotlib.container import BarContainer, ErrorbarContainer

    from fedsl.report.plots import plt
    from fedsl.report.report import bars_figure
    from fedsl.report.tables import Reached, fmt

    some, none, all_ = Reached([15, None]), Reached([None, ""]), Reached([10, 20])
    assert (tuple(some), some.k, some.n) == ((15.0, 0.0), 1, 2)
    assert [fmt(x, "T_0.5") for x in (some, none, all_)] == ["15 (1 of 2 seeds)", "not reached (0 of 2 seeds)",
                                                             "15.0 ± 7.1"]
    rows = [{"variant": v, "seeds": 2, "final_accuracy": (0.5, 0.01), "rise_time": all_, "T_0.5": t}
            for v, t in (("A", some), ("B", none), ("C", all_))]
    fig = bars_figure(rows)
    t05 = fig.axes[2]
    (bars,) = [c for c in t05.containers if isinstance(c, BarContainer)]
    assert [(round(b.get_x() + b.get_width() / 2), b.get_hatch()) for b in bars] == [(0, "//"), (2, None)]
    assert sorted(t.get_text() for t in t05.texts) == ["1 of 2", "not reached (0 of 2)"]
    errs = [c for c in t05.containers if isinstance(c, ErrorbarContainer)]
    assert [round(seg[0][0]) for seg in errs[0].lines[2][0].get_segments()] == [2]  # C only: A's mean is partial
    plt.close(fig)


def test_curves_have_whole_round_ticks_and_a_legend_clear_of_the_line_ends():
    from fedsl.report.plots import curves_figure, plt

    curves = {name: ([0, 1, 2], [0.1, 0.5, 0.9], [0.1, 0.3, end], [0.0] * 3)
              for name, end in (("FedAvg", 0.15), ("FSL", 0.5), ("DS", 0.95))}
    fig = curves_figure(curves, "quick")
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    box = ax.get_legend().get_window_extent()
    for line in ax.get_lines():
        x, y = ax.transData.transform((line.get_xdata()[-1], line.get_ydata()[-1]))
        assert not (box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1), line.get_label()
    assert box.x0 >= ax.get_window_extent().x1  # beside the axes: it can hide no data
    plt.close(fig)


def test_report_judges_the_claims_and_states_the_time_resolution(tmp_path, capsys):
    """[[claims]] of a group are judged in report.md by the stated rule; sparse evaluation is said."""
    cfg = tmp_path / "claims.toml"
    cfg.write_text('seeds = [0, 1]\neval_every = 5\nrolling_window = 3\n' + tiny(tmp_path, rounds=12).read_text()
                   + '\n[variants.FSL.algorithm]\nname = "fsl"\n[variants.FedAvg.algorithm]\nname = "fedavg"\n'
                   + '[[claims]]\ntext = "FSL beats FedAvg"\nbetter = "FSL"\nworse = "FedAvg"\n')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    assert main(["report", str(out)]) == 0
    md = (out / "report" / "report.md").read_text()
    judged = md.split("## The paper's claims, judged from these runs")[1]
    row = next(line for line in judged.splitlines() if line.startswith("| FSL beats FedAvg |"))
    # both sides ran seeds 0 and 1: the test pairs them, and Holm's p (one test: the same p) stands beside it
    assert "(2; 2 seeds)" in row and "paired t (seeds 0, 1)" in row and "(SE)" in row and "(Holm " in row
    # the verdict and p of that row, recomputed here from the runs' summaries: scipy's paired t on the per-seed
    # differences of final accuracy, one-sided each way
    from scipy import stats
    acc = {(v, s): json.loads((out / f"{v}-seed{s}" / "summary.json").read_text())["final_accuracy"]
           for v in ("FSL", "FedAvg") for s in (0, 1)}
    d = [acc["FSL", s] - acc["FedAvg", s] for s in (0, 1)]
    p_for = stats.ttest_1samp(d, 0.0, alternative="greater").pvalue
    p_against = stats.ttest_1samp(d, 0.0, alternative="less").pvalue
    verdict = "holds" if p_for < 0.05 else "contradicted" if p_against < 0.05 else "not shown"
    p_shown = p_against if verdict == "contradicted" else p_for
    assert f"**{verdict}**" in row, (d, p_for, row)
    assert ("p < 0.001" if p_shown < 0.001 else f"p = {p_shown:.3f}") in row, (p_shown, row)
    assert "Rule: one-sided tests at the 5% level" in judged
    assert "found to within 5 rounds" in md
    capsys.readouterr()


def test_a_group_with_runs_not_yet_finished_reports_what_it_has(tmp_path, capsys):
    """A group kept while some runs still go (reproduction/ collects finished runs only): a variant without a
    finished run has 0 seeds and 'did not run' beside the paper, not 'shorter: 0 of N rounds' or 'not reached'."""
    top = 'paper = { FSL = { final_accuracy = 0.61, "T_0.5" = 203 }, FedAvg = { final_accuracy = 0.5 } }\n'
    cfg = tmp_path / "g.toml"
    cfg.write_text(top + tiny(tmp_path, rounds=2).read_text()
                   + '\n[variants.FSL.algorithm]\nname = "fsl"\n[variants.FedAvg.algorithm]\nname = "fedavg"\n')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    for f in (out / "FedAvg").iterdir():  # as if FedAvg had not run yet
        f.unlink()
    assert main(["report", str(out)]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "| FedAvg | 0 | — | — | — |" in md
    paper = md.split("## Ours next to the paper's")[1]
    row = next(line for line in paper.splitlines() if line.startswith("| FedAvg |"))
    assert row.rstrip(" |").endswith("did not run") and "not reached" not in row, row
    assert "0 of" not in md and "Not comparable" not in md
    capsys.readouterr()


def test_a_quick_report_says_its_names_and_claims_are_the_full_presets_and_what_ran(tmp_path, capsys):
    """A quick form shrinks D0 under variant names that state the full size ("FSL-500"): the report says so and
    gives each variant's n0 as its runs recorded it."""
    top = 'paper = { FSL-500 = { final_accuracy = 0.61 } }\n'
    cfg = tmp_path / "g.toml"
    body = tiny(tmp_path, rounds=2).read_text()
    cfg.write_text(top + body + '\n[quick]\nrounds = 2\n"variants.FSL-500.data.server_size" = 12\n'
                   '[variants.FSL-500]\ndata = { "server_size" = 20 }\n[variants.FSL-250]\n'
                   'data = { "server_size" = 10 }\n')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--quick", "--out", str(out), "--quiet"]) == 0
    assert main(["report", str(out)]) == 0
    md = (out / "report" / "report.md").read_text()
    assert ("**Names and claims are the full preset's;** the server data of this quick form: FSL-500: n0 = 12, "
            "FSL-250: n0 = 10.") in md, md
    capsys.readouterr()


def test_the_diagnostics_legend_stands_beside_the_plots_not_over_a_curve():
    from fedsl.report.plots import plt
    from fedsl.report.report import diagnostics_figure

    series = {f"run{i}": [{"round": r, "xi2": 1.0 + i + r, "G2": 2.0 + i * r} for r in (0, 10, 20)] for i in range(3)}
    fig = diagnostics_figure(series)
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert [t.get_text() for t in legend.get_texts()] == ["run0", "run1", "run2"]
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    assert all(ax.get_legend() is None for ax in fig.axes)
    plt.close(fig)
