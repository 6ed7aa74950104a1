"""The numbers of reproduction/ cannot drift: each committed index.csv is what its runs' files give, each run's
summary.json is what its metrics.csv gives, and every statistic REPRODUCTION.md's prose quotes (a mean ± sample
std, a difference ± SE, a p-value, a plain number, a count of runs) is one its section's folders compute
(reproduction/prose.py)."""

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from fedsl.report import tables

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "reproduction"
# Folders from before every run's metrics.csv and summary.json were kept: their index.csv is the only record of
# their runs, so nothing rebuilds it; it is frozen here by the first 16 hex digits of its SHA-256, so that an edit
# by hand fails too. Every other folder keeps all of its runs' files, and its index.csv is rebuilt from them.
INDEX_ONLY = {"appendix-fslp-new-cpu": "277766df5338383d",
              "appendix-no-pretrain-c10-new-cpu": "d994715f1fbaf07a",
              "appendix-no-pretrain-new-cpu": "915f147efad2e16b",
              "fig2-cifar10-new-cpu": "98bea4ae11b0960a", "fig2-emnist-new-cpu": "a471c4e09e1bbbb4",
              "fig3-cifar10-new-cpu": "881aaf58d28571b3", "fig3-emnist-new-cpu": "beee5978f9a6bfcd",
              "fig5-cifar10-c2-new-cpu": "731bf4ce526c4c23", "fig5-cifar10-c5-new-cpu": "e1860dab63773b30",
              "fig5-cifar10-fsl-grid-gpu": "dde2474a45e83295", "fig5-cifar10-fslsyn-feddyn-cpu": "d84a2c45aad834ce",
              "fig5-cifar10-gpu": "85e5fa981adf7576", "fig5-emnist-new-cpu": "f3e448f4e26f1b58",
              "parity-cifar10": "4105f1f80aef17e8", "table1-cifar10-new-cpu": "2ae82bf53ada6511"}
GROUPS = sorted(p.name for p in REPRO.iterdir() if (p / "group.json").is_file())
KEPT = [g for g in GROUPS if g not in INDEX_ONLY]


def _run_files(folder: Path) -> list[Path]:
    runs = json.loads((folder / "group.json").read_text())["runs"]
    return [folder / r.get("dir", name) / f for name, r in runs.items() for f in ("metrics.csv", "summary.json")]


def test_every_folder_keeps_all_its_runs_files_or_is_a_named_index_only_record():
    for name in GROUPS:
        present = [f.is_file() for f in _run_files(REPRO / name)]
        assert (not any(present)) if name in INDEX_ONLY else all(present), name


@pytest.mark.parametrize("name", sorted(INDEX_ONLY))
def test_an_index_only_record_is_as_it_was_committed(name):
    assert hashlib.sha256((REPRO / name / "index.csv").read_bytes()).hexdigest()[:16] == INDEX_ONLY[name]


@pytest.mark.parametrize("name", KEPT)
def test_index_csv_is_rebuilt_from_the_runs_files(name):
    """index.csv as `reproduction/collect.py` writes it (``fedsl.report.tables.index_csv``) from each run's
    summary.json, and each summary.json's final accuracy, rise time and T_0.5 from its metrics.csv."""
    assert tables.index_differences(REPRO / name) == [], "an index.csv differs from its runs' summary.json"
    assert tables.summary_differences(REPRO / name) == [], "a summary.json differs from its metrics.csv"


def test_one_number_edited_by_hand_in_an_index_csv_is_found(tmp_path):
    """FSL-500's seed-0 final accuracy in a copy of table1-cifar10-full's index.csv, one digit changed."""
    src, dest = REPRO / "table1-cifar10-full", tmp_path / "t1"
    dest.mkdir()
    for f in ("group.json", "index.csv"):
        shutil.copy2(src / f, dest / f)
    for f in _run_files(src):
        (dest / f.parent.name).mkdir(exist_ok=True)
        shutil.copy2(f, dest / f.parent.name / f.name)
    assert tables.index_differences(dest) == []
    text = (dest / "index.csv").read_bytes().decode()
    line = next(x for x in text.splitlines() if x.startswith("FSL-500-seed0,"))
    value = line.split(",")[4]
    edited = line.replace(value, value[:-1] + str((int(value[-1]) + 1) % 10))
    (dest / "index.csv").write_bytes(text.replace(line, edited).encode())
    found = tables.index_differences(dest)
    assert len(found) == 1 and "FSL-500-seed0" in found[0] and value in found[0]


def _prose():
    spec = importlib.util.spec_from_file_location("prose", REPRO / "prose.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["prose"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_statistic_the_prose_quotes_is_computed_from_its_sections_folders():
    """Outside the generated blocks, each 'mean ± std', 'difference ± SE' and p-value of REPRODUCTION.md and of each
    experiment's page is one that the folders its section names give, and so is each plain decimal and each count of
    runs, trials or seeds, on every page but those of prose.NOT_YET (reproduction/prose.py lists any that is not)."""
    prose = _prose()
    assert len(prose.documents()) > 20  # REPRODUCTION.md and the pages
    problems = prose.check_record()
    assert problems == [], "\n".join(problems)


def test_the_prose_check_finds_a_stale_number():
    """FedDU's mean on CIFAR-10 one digit off, and a p-value the rule no longer gives (Welch's, unlabelled)."""
    prose = _prose()
    text = (REPRO / "pages" / "rivals-cifar10.md").read_text()
    for old, new, stale in (("- **FedDU**: 0.431 ± 0.017", "- **FedDU**: 0.432 ± 0.017", "'0.432 ± 0.017'"),
                            ("(+0.111 ± 0.023, p = 0.020", "(+0.111 ± 0.023, p = 0.022", "'p = 0.022'")):
        assert text.count(old) == 1
        found = prose.check(text.replace(old, new))
        assert len(found) == 1 and stale in found[0], found


def test_a_sentence_that_says_a_folder_has_not_run_while_it_holds_finished_runs_is_found():
    """The Shakespeare section said `shakespeare-tuned` "has not run yet" while its 15 runs were committed: such a
    sentence is listed, naming the folder; one about a folder that does not exist, or naming none, is not."""
    prose = _prose()
    old = ("which this untuned comparison does not try; the preset\n  `shakespeare-tuned` tunes γ, η_l and η_g for "
           "every method alike on validation windows, and has not run yet.\n- **Beside published numbers**")
    assert prose.stale(old) == ["line 2: says `shakespeare-tuned` has not run, but reproduction/shakespeare-tuned "
                                "holds finished runs"]
    assert prose.stale("The preset `no-such-folder` has not run yet.\nNext.") == []
    assert prose.stale("That re-run (about 6 CPU core-hours) has not run yet.\nSee `shakespeare-tuned`.") == []
    assert not any(prose.stale(p.read_text()) for p in prose.documents())


SYNTHETIC = "Files: `reproduction/serverdata-cifar10-tuned`.\n"  # a one-section page on a small tuned folder


def test_a_plain_number_is_checked_against_the_variant_its_line_names():
    """FSL's tuned mean passes; the same number shifted by +0.007, or a true value of another variant under FSL's
    name, is reported with its line."""
    prose = _prose()
    assert prose.plain(SYNTHETIC + "FSL ends at 0.463 after tuning.\n") == []
    for wrong in ("0.470", "0.311"):
        found = prose.plain(SYNTHETIC + f"FSL ends at {wrong} after tuning.\n")
        assert len(found) == 1 and found[0].startswith(f"line 2: '{wrong}'") and "FSL" in found[0], found


def test_a_shifted_plain_number_on_a_page_fails_the_record_check():
    """The assessment page's "0.016 apart in gain" (STL-10 504 against 10 clients × 50) shifted by +0.007 is
    reported by what the record's test enforces (prose.problems), naming its line; the page as it is passes."""
    prose = _prose()
    text = (REPRO / "pages" / "assess-validation.md").read_text()
    assert text.count("(0.016 apart in gain)") == 1 and prose.problems(text) == []
    line = text[:text.index("(0.016 apart in gain)")].count("\n") + 1
    found = prose.problems(text.replace("(0.016 apart in gain)", "(0.023 apart in gain)"))
    assert len(found) == 1 and found[0].startswith(f"line {line}: '0.023'"), found


def test_a_table_cell_is_checked_against_its_row_and_column():
    """A table row naming FSL takes FSL's values only: FedAvg's 0.311 in FSL's row is reported."""
    prose = _prose()
    table = "| method | final accuracy |\n|---|---|\n| FSL | {} |\n| FedAvg | 0.311 |\n"
    assert prose.plain(SYNTHETIC + table.format("0.463")) == []
    found = prose.plain(SYNTHETIC + table.format("0.311"))
    assert len(found) == 1 and found[0].startswith("line 4: '0.311'"), found


def test_a_number_quoted_from_a_paper_passes_only_where_it_is_marked():
    """"(paper: 0.83)" and a table column headed "paper" are the paper's numbers; the same number unmarked is not
    one of the folder's and is reported."""
    prose = _prose()
    assert prose.plain(SYNTHETIC + "FSL ends at 0.463 (paper: 0.83).\n") == []
    assert prose.plain(SYNTHETIC + "| method | ours | paper |\n|---|---|---|\n| FSL | 0.463 | 0.83 |\n") == []
    found = prose.plain(SYNTHETIC + "FSL ends at 0.463; the paper reports 0.83.\n")
    assert len(found) == 1 and "'0.83'" in found[0], found


def test_counting_words_are_checked_against_the_folders_counts():
    """The folder's studies ran 24 trials a method (FedAvg 30, its range widened), 3 seeds, 21 runs: those pass; "two
    of each method's six trials" (the sentence the record once had), 4 seeds and 25 runs do not."""
    prose = _prose()
    for good in ("Each study ran 24 trials.", "FedAvg ran 30 trials.", "FSL ran on 3 fresh seeds.", "The 21 runs."):
        assert prose.plain(SYNTHETIC + good + "\n") == [], good
    for bad, n in (("Two of each method's six trials diverged or failed.", 2), ("FSL ran on 4 fresh seeds.", 1),
                   ("The 25 runs.", 1), ("FedAvg ran 31 trials.", 1)):
        found = prose.plain(SYNTHETIC + bad + "\n")
        assert len(found) == n and all(f.startswith("line 2:") for f in found), (bad, found)


def test_only_the_named_pages_are_left_out_of_the_plain_number_check():
    """Every page outside NOT_YET passes ``plain`` (check_record enforces it); each page of NOT_YET exists and still
    has a number to account for, so that a page fixed leaves the list."""
    prose = _prose()
    pages = {p.name: p for p in prose.documents()}
    for name in sorted(prose.NOT_YET):
        assert name in pages and prose.plain(pages[name].read_text()), name


def test_a_variant_the_claims_read_without_runs_of_its_own_is_named_by_the_prose():
    """FedAvg+FT (FedAvg's runs fine-tuned on D0) has no row in rivals-cifar10's index.csv, but its claims read it:
    its mean and its difference to FSL pass where the line names it; the difference shifted does not."""
    prose = _prose()
    page = "Files: `reproduction/rivals-cifar10`.\n"
    assert prose.plain(page + "FedAvg+FT ends at 0.475, 0.11 below FSL.\n") == []
    found = prose.plain(page + "FedAvg+FT ends at 0.475, 0.13 below FSL.\n")
    assert len(found) == 1 and "'0.13'" in found[0], found


def test_a_sum_written_out_is_checked_by_computing_it():
    """"0.999^300 = 0.74" passes by arithmetic, with no folder; "0.999^300 = 0.70" is reported as not computing."""
    prose = _prose()
    page = "Files: `reproduction/rivals-cifar10`.\n"
    assert prose.plain(page + "The decay is 0.999^300 = 0.74 and 10 × 50 = 500.\n") == []
    found = prose.plain(page + "The decay is 0.999^300 = 0.70.\n")
    assert len(found) == 1 and "does not compute" in found[0], found


def test_several_cells_of_one_setting_named_on_a_line_each_count():
    """privacy-emnist: "FSL with DP ends 0.12 above FedAvg with DP at ε = 1, down to 0.09 at ε = 4" names two cells
    of the ε sweep, and each difference is one of the variants of those two cells; 0.15 is none of them, nor is FSL's
    0.17 at ε = 1 when the line names only ε = 4."""
    prose = _prose()
    page = "Files: `reproduction/privacy-emnist`.\n"
    assert prose.plain(page + "FSL with DP ends 0.12 above FedAvg with DP at ε = 1, down to 0.09 at ε = 4.\n") == []
    found = prose.plain(page + "FSL with DP ends 0.12 above FedAvg with DP at ε = 1, down to 0.15 at ε = 4.\n")
    assert len(found) == 1 and "'0.15'" in found[0], found
    assert prose.plain(page + "D0 only ends at 0.221, 0.17 below FSL with DP at ε = 4.\n") != []


def test_a_value_in_powers_of_ten_a_widened_range_and_a_holm_p_on_the_next_line_are_checked():
    """serverdata-cifar10-tuned: FedDF's chosen distillation step "1.62·10^-5" passes and "1.72·10^-5" does not;
    FedAvg's η_g range "widened to 0.0316" (best.json's `widened`) passes and 0.0416 does not; a "Holm" at a line's
    end takes the p at the start of the next (0.011 is FSL against FedDF's, 0.021 no Holm p of the folder)."""
    prose = _prose()
    page = SYNTHETIC
    assert prose.plain(page + "FedDF chose lr 1.62·10^-5.\n") == []
    assert "'1.72·10^-5'" in "".join(prose.plain(page + "FedDF chose lr 1.72·10^-5.\n"))
    assert prose.plain(page + "FedAvg's range was widened to 0.0316.\n") == []
    assert len(prose.plain(page + "FedAvg's range was widened to 0.0416.\n")) == 1
    assert prose.plain(page + "FSL beats FedDF (p = 0.002, Holm\n  0.011) here.\n") == []
    found = prose.plain(page + "FSL beats FedDF (p = 0.002, Holm\n  0.021) here.\n")
    assert len(found) == 1 and found[0].startswith("line 3: 'Holm 0.021'"), found


def test_a_time_of_the_folders_round_cost_table_is_the_variants():
    """serverdata-cifar10's round_cost.md: FSLsyn's 1.13 CPU-s a round passes in FSLsyn's row, and 1.23 does not."""
    prose = _prose()
    page = "Files: `reproduction/serverdata-cifar10`.\n| method | s per round |\n|---|---|\n"
    assert prose.plain(page + "| FSLsyn | 1.13 (0.59) |\n") == []
    found = prose.plain(page + "| FSLsyn | 1.23 (0.59) |\n")
    assert len(found) == 1 and "'1.23'" in found[0], found


def test_a_shifted_number_of_a_swept_cell_fails_the_record_check():
    """robustness-emnist (a sweep over the attackers' fraction f): FSL's "0.563 at f = 0.2" under sign flipping
    passes, and shifted by +0.007 is reported by what the record's test enforces, naming its line."""
    prose = _prose()
    text = (REPRO / "pages" / "robustness-emnist.md").read_text()
    assert text.count("0.563 at f = 0.2") == 1 and prose.problems(text) == []
    line = text[:text.index("0.563 at f = 0.2")].count("\n") + 1
    found = prose.problems(text.replace("0.563 at f = 0.2", "0.570 at f = 0.2"))
    assert len(found) == 1 and found[0].startswith(f"line {line}: '0.570'"), found


def test_a_table_column_of_rounds_reads_each_runs_metrics_at_those_rounds():
    """shakespeare: the column "accuracy at round 50 / 100 / 150" takes the row's variant's metrics.csv at those
    rounds (FedAdam's means over seeds 0.300 / 0.373 / 0.411); a mean shifted by +0.007 is reported."""
    prose = _prose()
    page = ("Files: `reproduction/shakespeare`.\n| method | accuracy at round 50 / 100 / 150 |\n|---|---|\n"
            "| FedAdam | {} |\n")
    assert prose.plain(page.format("0.300 / 0.373 / 0.411")) == []
    found = prose.plain(page.format("0.300 / 0.380 / 0.411"))
    assert len(found) == 1 and found[0].startswith("line 4: '0.380'"), found


def test_two_names_of_the_same_variant_are_one_vote():
    """"D0" and "D0 only" both name D0-only: a line naming FedAdam and D0 only takes FedAdam's settings too (its
    τ = 0.001), where the two names once outvoted FedAdam; a τ FedAdam does not have is reported."""
    prose = _prose()
    page = "Files: `reproduction/shakespeare`.\n"
    assert prose.plain(page + "FedAdam (τ = 0.001) and D0 only (D0 = 5,000 windows).\n") == []
    assert len(prose.plain(page + "FedAdam (τ = 0.0003) and D0 only (D0 = 5,000 windows).\n")) == 1


def test_a_paper_quote_may_be_a_clause_of_a_parenthesis():
    """"(FSL 0.463; the paper: 0.83)": the clause after "; " that opens with "paper:" is the paper's; FSL's own
    number before it is still checked, and a number after the parenthesis is not the paper's."""
    prose = _prose()
    assert prose.plain(SYNTHETIC + "FSL ends higher (FSL 0.463; the paper: 0.83).\n") == []
    found = prose.plain(SYNTHETIC + "FSL ends higher (FSL 0.470; the paper: 0.83).\n")
    assert len(found) == 1 and "'0.470'" in found[0], found
    assert len(prose.plain(SYNTHETIC + "FSL ends higher (FSL 0.463; the paper: 0.83), by 0.91.\n")) == 1


def test_a_grid_cells_loss_against_its_columns_best_is_the_cells():
    """fig5-cifar10-full (η_l × C, one seed): FedDyn's loss at η_l = 0.005, C = 1 against the column's best, 0.234,
    passes where the line names that cell; shifted by +0.007 it is reported, and so is FSL's name on it."""
    prose = _prose()
    page = "Files: `reproduction/fig5-cifar10-full`.\n"
    assert prose.plain(page + "FedDyn loses most at η_l = 0.005 (0.234 at C = 1).\n") == []
    for wrong in ("FedDyn loses most at η_l = 0.005 (0.241 at C = 1).",
                  "FSL loses most at η_l = 0.005 (0.234 at C = 1)."):
        found = prose.plain(page + wrong + "\n")
        assert len(found) == 1 and found[0].startswith("line 2:"), found


def test_a_difference_of_two_variants_of_two_folders_and_a_paper_row():
    """table1-cifar10-200-rounds: FSL-250 (table1-cifar10-new-cpu) against FSL at η_l = 0.02 (fig5-cifar10-c2-new-cpu)
    differ by 0.029, a difference across the section's two folders; 0.036 is not theirs. A table row whose first cell
    says "paper" holds the paper's numbers, unchecked; the same numbers in a row of ours are reported."""
    prose = _prose()
    page = "Files: `reproduction/table1-cifar10-new-cpu`, `reproduction/fig5-cifar10-c2-new-cpu`.\n"
    assert prose.plain(page + "FSL-250 → FSL at η_l = 0.02 adds 0.029.\n") == []
    assert len(prose.plain(page + "FSL-250 → FSL at η_l = 0.02 adds 0.036.\n")) == 1
    table = ("| | FSL-250 | FSLsyn-720 |\n|---|---|---|\n| accuracy at 200 (ours) | 0.535 | 0.554 |\n"
             "| {} | 0.585 | 0.584 |\n")
    assert prose.plain(page + table.format("accuracy at 1,000 (paper)")) == []
    assert len(prose.plain(page + table.format("accuracy at 1,000 (ours)"))) == 2


def test_a_number_quoted_from_an_independent_implementation_passes_only_where_it_is_marked():
    """parity-cifar10: the independent implementation's FSL 0.592 is none of fedsl's runs' values; "(independent:
    0.592)" and a table column headed "independent" mark it as quoted, the same number unmarked is reported."""
    prose = _prose()
    page = "Files: `reproduction/parity-cifar10`.\n"
    assert prose.plain(page + "FSL ends at 0.595 (independent: 0.592).\n") == []
    assert prose.plain(page + "FSL ends higher (FSL 0.595; the independent one: 0.592).\n") == []
    table = "| | {} | fedsl |\n|---|---|---|\n| FSL | 0.592 | 0.595 |\n"
    assert prose.plain(page + table.format("independent")) == []
    found = prose.plain(page + "FSL ends at 0.595; the independent implementation reached 0.592.\n")
    assert len(found) == 1 and found[0].startswith("line 2: '0.592'"), found
    found = prose.plain(page + table.format("ours too"))
    assert len(found) == 1 and found[0].startswith("line 4: '0.592'"), found


def test_a_setting_of_the_preset_a_folder_is_named_after_is_a_setting(tmp_path):
    """parity-cifar10 keeps no config.json: its preset's η_l = 0.02 passes as a setting, a preset number that is no
    setting (a claim's seed_std) and another η_l do not; the same folder under another name does not read the
    preset."""
    prose = _prose()
    page = "Files: `reproduction/parity-cifar10`.\n"
    assert prose.plain(page + "FSL trains with η_l = 0.02.\n") == []
    for wrong in ("FSL trains with η_l = 0.03.", "FSL's seed std is 0.031 by the claims."):
        found = prose.plain(page + wrong + "\n")
        assert len(found) == 1 and found[0].startswith("line 2:"), found
    for name, has in (("parity-cifar10", True), ("parity-cifar10-renamed", False)):
        folder = tmp_path / name
        folder.mkdir()
        spec = json.loads((REPRO / "parity-cifar10" / "group.json").read_text())
        (folder / "group.json").write_text(json.dumps(spec | {"name": "parity-cifar10"}))
        shutil.copy2(REPRO / "parity-cifar10" / "index.csv", folder / "index.csv")
        assert (0.02 in prose.variant_values(folder).variants["FSL"]) is has, name
