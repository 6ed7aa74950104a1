"""Claims judged by the stated rule (fedsl.report.verdicts), against hand-computed cases."""

import csv
import json
import math

import pytest
from scipy import stats

from fedsl.config import presets
from fedsl.config import schema as C
from fedsl.report import verdicts as V


def claim(**kw):
    return C.Claim.model_validate({"text": "A beats B", "better": "A", **kw})


def test_welch_by_hand():
    """A = (1, 2, 3), B = (0, 0, 1): d = 5/3, SE = √(1/3 + 1/9) = 2/3, t = 2.5, Welch df = 3.2."""
    v = V.ordering(claim(worse="B"), [1, 2, 3], [0, 0, 1], {})
    assert v.diff == pytest.approx(5 / 3) and v.se == pytest.approx(2 / 3) and v.df == pytest.approx(3.2)
    assert v.p == pytest.approx(stats.t.sf(2.5, 3.2)) and 0.04 < v.p < 0.05
    assert v.verdict == "holds" and v.test == "Welch t"
    assert V.ordering(claim(worse="B"), [0, 0, 1], [1, 2, 3], {}).verdict == "contradicted"
    assert V.ordering(claim(worse="B"), [1, 2, 3], [0, 1, 2], {}).verdict == "not shown"  # t = 1.22


def test_fewer_rounds_is_better_for_times():
    c = claim(worse="B", metric="T_0.5")
    assert V.ordering(c, [100, 110, 105], [200, 210, 190], {}).verdict == "holds"
    assert V.ordering(c, [200, 210, 190], [100, 110, 105], {}).verdict == "contradicted"


def test_one_seed_needs_a_measured_spread():
    v = V.ordering(claim(worse="B"), [0.60], [0.585], {})
    assert v.verdict == "not shown" and "no measured seed spread" in v.line()
    # with σ = 0.01 over 3 seeds: t = 0.015 / (0.01·√2) = 1.06 on 2 df: inside the noise
    c = claim(worse="B", seed_std=0.01, seed_std_seeds=3)
    v = V.ordering(c, [0.60], [0.585], {})
    assert v.p == pytest.approx(stats.t.sf(0.015 / (0.01 * math.sqrt(2)), 2)) and v.verdict == "not shown"
    assert V.ordering(c, [0.66], [0.585], {}).verdict == "holds"  # t = 5.3, p = 0.017


def test_equal_seeds_on_both_sides_are_decided_by_the_sign():
    assert V.ordering(claim(worse="B"), [0.5, 0.5], [0.4, 0.4], {}).verdict == "holds"
    assert V.ordering(claim(worse="B"), [0.5, 0.5], [0.5, 0.5], {}).verdict == "not shown"


def test_trend_is_the_slopes_t_test():
    c = claim(trend="data.classes_per_client")
    xs, ys = [1, 2, 5, 10], [0.30, 0.42, 0.50, 0.60]
    v = V.trend(c, xs, ys, {})
    fit = stats.linregress(xs, ys)
    assert v.diff == pytest.approx(fit.slope) and v.se == pytest.approx(fit.stderr) and v.df == 2
    assert v.verdict == "holds" and v.p == pytest.approx(fit.pvalue / 2)
    assert V.trend(claim(trend="k", direction="down"), xs, ys, {}).verdict == "contradicted"
    assert V.trend(c, [1, 2], [0.3, 0.4], {}).verdict == "not shown"  # 2 points: no residual to test against


def test_claims_need_exactly_one_of_worse_or_trend():
    for bad in ({}, {"worse": "B", "trend": "k"}):
        with pytest.raises(Exception, match="exactly one of worse"):
            claim(**bad)


def test_each_sides_own_values_pair_a_pinned_variant_with_one_swept_value(tmp_path):
    """DS pinned at γ = 0 against FSL at γ = 1 of {0.5, 1}: better_at / worse_at pick each side's runs and leave
    γ out of the cell, so the seeds pair (per seed +0.02, +0.03, +0.04); without them no cell holds both sides."""
    rows = [{"run": f"DS-s{s}", "base": "DS", "seed": s, "server.gamma": 0.0, "algorithm.local_lr": 0.01,
             "final_accuracy": 0.70 + 0.01 * s} for s in range(3)]
    rows += [{"run": f"FSL-g{g}-s{s}", "base": "FSL", "seed": s, "server.gamma": g, "algorithm.local_lr": 0.01,
              "final_accuracy": 0.72 + 0.02 * s if g == 1.0 else 0.60} for g in (0.5, 1.0) for s in range(3)]
    runs = V.group_values(_group(tmp_path, rows, sweep=("server.gamma", "algorithm.local_lr")))
    plain = V.judge(claim(better="FSL", worse="DS"), runs)
    assert all(0 in v.n for v in plain)  # each cell holds one side only
    [v] = V.judge(claim(better="FSL", worse="DS", better_at={"server.gamma": 1.0}, worse_at={"server.gamma": 0.0}),
                  runs)
    assert v.cell == {"algorithm.local_lr": 0.01} and v.n == (3, 3) and list(v.seeds_paired) == [0, 1, 2]
    d = [0.02, 0.03, 0.04]
    assert v.diff == pytest.approx(0.03, abs=1e-12) and v.se == pytest.approx(0.01 / math.sqrt(3), abs=1e-12)
    assert v.p == pytest.approx(stats.t.sf(0.03 / (0.01 / math.sqrt(3)), 2), abs=1e-12) and v.verdict == "holds"
    assert sum(d) / 3 == pytest.approx(v.diff)
    with pytest.raises(Exception, match="better_at / worse_at select the two sides of an ordering"):
        claim(trend="server.gamma", better_at={"server.gamma": 1.0})


def _group(tmp_path, rows, sweep=()):
    """A group folder kept as group.json + index.csv only (as reproduction/ keeps old runs)."""
    runs = {r["run"]: {"dir": r["run"], "variant": r["run"], "base": r["base"], "seed": r["seed"],
                       "params": {k: r[k] for k in sweep}} for r in rows}
    (tmp_path / "group.json").write_text(json.dumps({"name": "g", "runs": runs, "sweep": list(sweep)}))
    cols = ["run", "variant", "seed", *sweep, "status", "final_accuracy", "rise_time", "T_0.5", "rounds_done"]
    with open(tmp_path / "index.csv", "w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({"variant": r["run"], "status": "completed", "rounds_done": 100, **r})
    return tmp_path


def test_a_group_is_judged_per_cell_and_a_time_never_reached_is_the_planned_rounds(tmp_path):
    rows = [{"run": f"{b}-C{c}-s{s}", "base": b, "seed": s, "data.classes_per_client": c,
             "final_accuracy": acc + 0.01 * s, "T_0.5": t}
            for b, c, acc, t in (("FSL", 2, 0.55, 40), ("SCAFFOLD", 2, 0.30, ""), ("FSL", 10, 0.60, 30),
                                 ("SCAFFOLD", 10, 0.60, 35))
            for s in range(3)]
    rows.append({"run": "pending", "base": "FSL", "seed": 9, "data.classes_per_client": 2, "status": "interrupted",
                 "final_accuracy": 0.0})
    path = _group(tmp_path, rows, sweep=("data.classes_per_client",))
    runs = V.group_values(path)
    assert len(runs) == 12  # the interrupted run is left out
    acc = V.judge(claim(better="FSL", worse="SCAFFOLD"), runs)
    assert {v.cell["data.classes_per_client"]: v.verdict for v in acc} == {2: "holds", 10: "not shown"}
    assert V.overall(acc) == "holds in 1 of 2 cells"
    only2 = V.judge(claim(better="FSL", worse="SCAFFOLD", at={"data.classes_per_client": 2}), runs)
    assert len(only2) == 1 and V.overall(only2) == "holds"
    times = V.judge(claim(better="FSL", worse="SCAFFOLD", metric="T_0.5", at={"data.classes_per_client": 2}), runs)
    assert times[0].means == (40, 100)  # SCAFFOLD never reached 0.5 in its 100 rounds
    trend = V.judge(claim(better="FSL", trend="data.classes_per_client"), runs)
    assert trend[0].n == (6, 2) and trend[0].verdict == "holds"
    md = V.markdown([(claim(better="FSL", worse="SCAFFOLD"), acc)])
    assert "**holds in 1 of 2 cells**" in md and "Welch" in md and V.RULE in md


def test_a_time_never_reached_by_a_run_that_diverged_early_is_its_planned_rounds(tmp_path):
    """B's seeds diverged at round 10 (fig5-cifar10-full's SCAFFOLD at η_l = 0.1, C = 1): they never reach 0.5, so
    their T_0.5 is censored at the T = 100 rounds planned, as for a run that ran them all; their last round would
    make B the fastest ('B reaches 0.5 sooner than A, p < 0.001'). T comes from summary.json's "rounds", else
    group.json's config for a group kept as index.csv only."""
    rows = [{"run": f"{b}-s{s}", "base": b, "seed": s, "final_accuracy": acc, "T_0.5": t, "rounds_done": done,
             "status": "completed" if done == 100 else "diverged"}
            for b, acc, t, done in (("A", 0.55, 60, 100), ("B", 0.10, "", 10)) for s in range(3)]
    rows[0]["T_0.5"] = 61  # a seed spread
    path = _group(tmp_path, rows)
    spec = json.loads((path / "group.json").read_text())
    (path / "group.json").write_text(json.dumps({**spec, "config": {"rounds": 100}}))
    v = V.judge(claim(better="A", worse="B", metric="T_0.5"), V.group_values(path))[0]
    assert v.means == pytest.approx((60 + 1 / 3, 100)) and v.verdict == "holds"
    assert V.run_value({"status": "diverged", "rounds": 1000, "rounds_done": 30, "T_0.5": None}, "T_0.5") == 1000
    assert V.run_value({"status": "diverged", "rounds_done": 30}, "T_0.5", planned=200) == 200
    assert V.run_value({"status": "completed", "rounds_done": 100}, "T_0.5") == 100  # nothing else known


def test_a_time_some_seeds_never_reached_is_given_as_a_bound_and_one_no_seed_reached_is_not_shown(tmp_path):
    """T_0.5 never reached is censored at T: the evidence gives that side's mean as a bound with its count of seeds
    that reached ('≥ 100 (0 of 3 reached)'), and where no seed of either side reached it (a quick form's 2 rounds)
    the claim is not shown, with the reason, not '2.0 vs 2.0 ... +0' judged as a tie."""
    rows = [{"run": f"{b}-s{s}", "base": b, "seed": s, "final_accuracy": 0.5, "T_0.5": t(s)}
            for b, t in (("A", lambda s: 30 + s), ("B", lambda s: 80 if s == 0 else "")) for s in range(3)]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    v = V.judge(claim(better="A", worse="B", metric="T_0.5"), V.group_values(_group(tmp_path / "a", rows)))[0]
    assert v.reached == (3, 1) and v.means == pytest.approx((31, 280 / 3)) and v.verdict == "holds"
    assert v.line().startswith("A 31.0 vs B ≥ 93.3 (1 of 3 reached) (3; 3 seeds): +62.33 ± ")
    none = [{**r, "T_0.5": ""} for r in rows]
    v = V.judge(claim(better="A", worse="B", metric="T_0.5"), V.group_values(_group(tmp_path / "b", none)))[0]
    assert (v.verdict, v.reached) == ("not shown", (0, 0))
    assert v.line() == ("A ≥ 100.0 (0 of 3 reached) vs B ≥ 100.0 (0 of 3 reached) (3; 3 seeds): +0, no seed of "
                        "either side reached it (both censored at T)")
    acc = V.judge(claim(better="A", worse="B"), V.group_values(_group(tmp_path / "b", none)))[0]
    assert acc.reached == () and " reached" not in acc.line()  # accuracy has no bound


def test_a_run_that_diverged_before_any_score_is_left_out_not_a_nan(tmp_path):
    """robustness-emnist's Krum: one seed diverged at round 10, before its first evaluation, so its final
    accuracy is NaN; it used to make the mean and the verdict NaN ('+nan, not shown'). It is left out, and the
    seed counts show it."""
    rows = [{"run": f"{b}-s{s}", "base": b, "seed": s, "final_accuracy": acc,
             "status": "diverged" if acc == "nan" else "completed"}
            for b, accs in (("A", (0.28, 0.29, 0.30)), ("B", ("nan", 0.02, 0.03))) for s, acc in enumerate(accs)]
    runs = V.group_values(_group(tmp_path, rows))
    assert len(runs) == 6 and sum("final_accuracy" in rv.values for rv in runs) == 5
    v = V.judge(claim(worse="B"), runs)[0]
    assert v.n == (3, 2) and v.means == pytest.approx((0.29, 0.025)) and v.verdict == "holds"
    assert "nan" not in v.line()


def test_every_preset_claim_names_its_variants_and_keys():
    for name in presets.names():
        cfg = C.validate(presets.load(name))
        variants = set(cfg.variants) or {cfg.name}
        for c in cfg.claims:
            # a variant fine-tuned on D0 after its last round is judged as NAME+FT too
            finetuned = {v + V.FINETUNED for v, over in cfg.variants.items() if (over.get("server") or {}).get(
                "finetune_epochs") or cfg.server.finetune_epochs}
            assert {c.better, c.worse or c.better} <= variants | finetuned, (name, c.text)
            assert c.trend is None or c.trend in cfg.sweep, (name, c.text)
            assert set(c.at) <= set(cfg.sweep), (name, c.text)
            assert set(c.better_at) | set(c.worse_at) <= set(cfg.sweep), (name, c.text)


def test_a_run_fine_tuned_on_d0_is_judged_as_its_own_variant_too(tmp_path):
    """server.finetune_epochs: the run counts as itself (its rounds' final accuracy) and as NAME+FT (the
    fine-tuned model's), so "FSL beats FedAvg then fine-tuned" is a plain ordering claim."""
    rows = [{"run": f"{b}-s{s}", "base": b, "seed": s, "final_accuracy": acc + 0.01 * s}
            for b, acc in (("FSL", 0.60), ("FedAvg", 0.50)) for s in range(3)]
    path = _group(tmp_path, rows)
    for s in range(3):  # summary.json of the FedAvg runs, with the fine-tuned accuracy
        (tmp_path / f"FedAvg-s{s}").mkdir()
        (tmp_path / f"FedAvg-s{s}" / "summary.json").write_text(json.dumps(
            {"status": "completed", "final_accuracy": 0.50 + 0.01 * s, "final_accuracy_finetuned": 0.55 + 0.01 * s}))
    runs = V.group_values(path)
    ft = sorted(r.values["final_accuracy"] for r in runs if r.base == "FedAvg+FT")
    assert ft == pytest.approx([0.55, 0.56, 0.57])
    assert len(runs) == 9
    assert V.judge(claim(better="FedAvg+FT", worse="FedAvg"), runs)[0].verdict == "holds"
    assert V.judge(claim(better="FSL", worse="FedAvg+FT"), runs)[0].verdict == "holds"


def test_runs_of_the_same_seeds_are_paired_by_hand():
    """A = (0.60, 0.62, 0.65), B = (0.58, 0.61, 0.62) on seeds 0, 1, 2: d_s = (0.02, 0.01, 0.03), mean 0.02, sd 0.01,
    SE = 0.01/√3, t = 2√3 on 2 df; Welch on the same numbers sees the sides' spread instead and does not hold."""
    c = claim(worse="B")
    a, b = [0.60, 0.62, 0.65], [0.58, 0.61, 0.62]
    v = V.ordering(c, a, b, {}, seeds=([0, 1, 2], [0, 1, 2]))
    assert v.test == "paired t (seeds 0, 1, 2)" and v.df == 2 and v.seeds_paired == (0, 1, 2)
    assert v.se == pytest.approx(0.01 / math.sqrt(3)) and v.p == pytest.approx(stats.t.sf(2 * math.sqrt(3), 2))
    assert v.verdict == "holds" and v.p < 0.05 and "± 0.0058 (SE), paired t" in v.line()
    welch = V.ordering(c, a, b, {})
    assert welch.test == "Welch t" and welch.p > 0.05 and welch.verdict == "not shown"
    # the order of B's runs does not matter: seeds pair them
    shuffled = V.ordering(c, a, [b[2], b[0], b[1]], {}, seeds=([0, 1, 2], [2, 0, 1]))
    assert shuffled.p == pytest.approx(v.p)


@pytest.mark.parametrize("seeds_b", [[0, 1, 3], [0, 1], [0, 0, 1], [0, 1, None]])
def test_runs_that_do_not_share_their_seeds_are_not_paired(seeds_b):
    """Pairing needs the same seeds on both sides, once each: another seed, a run left out (diverged before any
    score), a seed twice or a run without a seed leave Welch."""
    b = [0.58, 0.61, 0.62][:len(seeds_b)]
    assert V.paired_seeds([0, 1, 2], seeds_b) is None
    v = V.ordering(claim(worse="B"), [0.60, 0.62, 0.65], b, {}, seeds=([0, 1, 2], seeds_b))
    assert v.test == "Welch t" and not v.seeds_paired


def test_equal_differences_fall_back_to_welch_and_equal_seeds_to_the_sign():
    """T_0.5 on a 10-round grid: every seed 30 rounds apart is no evidence of zero noise, so Welch reads the sides'
    spread; with no spread on either side either, the sign decides as before."""
    c = claim(worse="B", metric="T_0.5")
    v = V.ordering(c, [80, 90, 90], [110, 120, 120], {}, seeds=([0, 1, 2], [0, 1, 2]))
    assert v.test.startswith("Welch t (every seed's difference equal") and v.se > 0 and v.verdict == "holds"
    flat = V.ordering(claim(worse="B"), [0.5, 0.5], [0.4, 0.4], {}, seeds=([0, 1], [0, 1]))
    assert flat.verdict == "holds" and flat.p == 0.0 and flat.p_against == 1.0


def test_holm_by_hand():
    """p = (0.01, 0.04, 0.03, —): sorted 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> 0.06 (monotone); no test
    stays NaN and does not count."""
    out = V.holm([0.01, 0.04, 0.03, math.nan])
    assert out[:3] == pytest.approx([0.03, 0.06, 0.06]) and math.isnan(out[3])
    assert V.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_holm_adjusts_a_contradicted_verdict_among_the_ps_against():
    """Two claims on one group: one holds (p = 0.010), one is contradicted (p against 0.020). Each Holm p is
    adjusted among the 2 p's of its own direction: 2·0.010 = 0.020 stands; the contradicted one's p against is the
    smaller of the two p's against, 2·0.020 = 0.040 stands too."""
    hold, contra = V.Verdict("h", "ordering", "final_accuracy", {}, "holds", (3, 3)), \
        V.Verdict("c", "ordering", "final_accuracy", {}, "contradicted", (3, 3))
    hold.p, hold.p_against, contra.p, contra.p_against = 0.010, 0.990, 0.980, 0.020
    V.with_holm([(claim(worse="B"), [hold]), (claim(worse="B"), [contra])])
    assert hold.p_holm == pytest.approx(0.020) and contra.p_holm == pytest.approx(0.040)
    assert hold.stands_after_holm() and contra.stands_after_holm()
    assert contra.p_text() == "p = 0.020 against (Holm 0.040)"
    assert V.multiplicity([(claim(worse="B"), [hold, contra])]) == (
        "Holm over the 2 tests: 1 of the 1 that hold and 1 of the 1 contradicted stand at the family-wise 5% level")


def test_the_committed_fine_tuning_control_is_paired():
    """rivals-cifar10: FedAvg against its own runs fine-tuned on D0 share everything but the fine-tuning, seed by
    seed. Welch's p was 0.059 (not shown); the paired p is 0.026 (holds)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "reproduction" / "rivals-cifar10"
    ft = next(c for c in V.claims_for(json.loads((path / "group.json").read_text())) if c.better == "FedAvg+FT"
              and c.worse == "FedAvg")
    v = V.judge(ft, V.group_values(path))[0]
    assert v.test == "paired t (seeds 0, 1, 2)" and round(v.p, 3) == 0.026 and v.verdict == "holds"
    welch = V.ordering(ft, *[[rv.values["final_accuracy"] for rv in V.group_values(path) if rv.base == b]
                            for b in ("FedAvg+FT", "FedAvg")], {})
    assert round(welch.p, 3) == 0.059 and welch.verdict == "not shown"
