"""A claim's words are no stronger than its verdict.

Words that say more than "A ends above B" ("reversed", "especially", "much better", "lifts", "≫", ...) may head a
claim only where the project's own statistics back them: the verdict holds and stands after Holm over its folder's
tests (``fedsl.report.verdicts``), in every cell it was judged in. This is checked where the verdicts are
(each folder's claims and each preset's, judged on the committed runs), in the summary rows REPRODUCTION.md
prints, and in every sentence of REPRODUCTION.md's prose and the reproduction folders' notes, which must cite a
verdict that stands after Holm in the same sentence. A strong word the paper wrote, quoted as the paper's ("much
better"), or one that is negated ("does not lift"), claims nothing of ours and is let through.
"""

import json
import re
import tomllib
from pathlib import Path

import pytest
from test_reproduction import _module

from fedsl.config import presets
from fedsl.report import verdicts

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "reproduction"
DOC = ROOT / "REPRODUCTION.md"
# headline words: each says more than an ordering inside the noise can
STRONG = re.compile(r"\b(revers(?:ed|es|al)|especially|much (?:better|worse|higher|lower|faster|slower)|clearly|"
                    r"significant(?:ly)?|lifts?|lifted|lifting|by far|"
                    r"far (?:above|below|ahead|behind|better|worse|more)|"
                    r"decisive(?:ly)?|dominates?|is what the runs show)\b|≫|≪", re.IGNORECASE)
# the paper's words: quoted, or a sentence attributed to it ("Paper: ...", as `fedsl report` lists its claims)
QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|(?<![\w])'[^']*'(?![\w])|^\W*Paper: .*")
NEGATED = re.compile(r"\b(not|no|never|nor|n't|without)\s+(?:\w+\s+){0,2}$", re.IGNORECASE)
# a verdict standing after Holm, cited: "stands after Holm", "all but one stand after Holm", "Holm 0.008"
STANDS = re.compile(r"\bstands? after Holm|\bHolm (?:< 0\.001|0\.0[0-4]\d)\b")
# ... unless its clause denies it: "not after Holm", "none of the three stands", "0 of the 6 stand"
DENIED = re.compile(r"\b(?:not|none|no|neither|nor|0 of)\b[^,;:()]*$", re.IGNORECASE)


def cites_standing(text: str) -> bool:
    """Whether ``text`` cites a verdict that stands after Holm (and does not deny it in the same clause)."""
    return any(not DENIED.search(text[:m.start()]) for m in STANDS.finditer(text))


def strong_words(text: str) -> list[str]:
    """The headline words of ``text`` that are ours: outside quotes (the paper's words) and not negated."""
    bare = QUOTED.sub(lambda m: " " * len(m.group()), text)
    return [m.group() for m in STRONG.finditer(bare) if not NEGATED.search(bare[:m.start()])]


def test_the_word_list_catches_what_it_should_and_lets_the_papers_words_through():
    assert strong_words("Reversed from the paper: FedDyn ends above FSL-250") == ["Reversed"]
    assert strong_words("FSL reaches much better accuracy than SCAFFOLD") == ["much better"]
    assert strong_words("A server with 500 labelled samples lifts FedAvg") == ["lifts"]
    assert strong_words("FSL, FSLsyn ≫ SCAFFOLD") == ["≫"]
    assert strong_words('the paper reads FSL as "much better" than both') == []
    assert strong_words("FedDF does not lift FedAvg here") == []
    assert strong_words("FSL ends above FedAvg at this budget") == []
    assert strong_words("- Paper: FSL reaches much better accuracy, especially at C = 1.") == []
    assert cites_standing("(p = 0.003, Holm 0.008)") and cites_standing("3 of the 3 that hold stand after Holm")
    assert cites_standing("FSL beats FedDU (p = 0.003, stands after Holm)")
    assert not cites_standing("(p = 0.035 against, Holm 0.696)") and not cites_standing("not after Holm")
    assert not cites_standing("it does not stand after Holm")
    assert not cites_standing("none of the three stands after Holm")
    assert not cites_standing("0 of the 6 stand after Holm")


def _judged_folders():
    for path in sorted(p for p in REPRO.iterdir() if (p / "group.json").is_file()):
        judged = verdicts.judge_group(path)
        if judged:
            yield path.name, judged


JUDGED = dict(_judged_folders())


def _backed(vs: list[verdicts.Verdict]) -> bool:
    """Every judged cell holds and stands after Holm."""
    said = [v for v in vs if v.verdict != "no runs"]
    return bool(said) and all(v.verdict == "holds" and v.stands_after_holm() for v in said)


def test_a_claim_with_a_strong_word_holds_after_holm_in_every_folder_that_judges_it():
    """Each folder's claims (its group.json's, else its preset's), judged on its committed runs."""
    bad = [f"{name}: {claim.text!r} ({verdicts.overall(vs)}; {verdicts.after_holm(vs) or 'no test'})"
           for name, judged in JUDGED.items() for claim, vs in judged
           if strong_words(claim.text) and not _backed(vs)]
    assert not bad, "\n".join(bad)


def test_a_presets_claim_with_a_strong_word_has_a_folder_where_it_stands():
    """A preset's claim text is what its next run's summary prints: a strong word in it needs a committed folder of
    that preset where the same claim holds after Holm (a claim never judged has no verdict to back a word)."""
    backed = {(json.loads((REPRO / name / "group.json").read_text()).get("name"), c.text)
              for name, judged in JUDGED.items() for c, vs in judged if _backed(vs)}
    bad = [f"{name}: {c['text']!r}" for name in presets.names()
           for c in presets.load(name).get("claims", []) if strong_words(c["text"]) and (name, c["text"]) not in backed]
    assert not bad, "\n".join(bad)


VERDICT_LINE = re.compile(r"^\*\*(?P<word>[^*]+)\*\*(?: \((?P<note>[^()]*)\))?: (?P<text>.*)$")


def test_a_summary_row_with_a_strong_word_cites_a_verdict_standing_after_holm():
    """REPRODUCTION.md's summary as printed: each verdict line of a row ('**holds** (p = 0.003, Holm 0.008): ...')
    whose claim text has a strong word holds and stands after Holm by its own note; the paper's column is the
    paper's words and is not ours to judge."""
    text = DOC.read_text()
    rows = _module("summary").in_doc(text, 0).splitlines()[2:]
    bad, seen = [], 0
    for row in rows:
        cells = row.strip("|").split(" | ")
        for line in cells[-1].split("<br>"):
            m = VERDICT_LINE.match(line)
            if not m:
                continue
            seen += 1
            note = m["note"] or ""
            k_of_n = re.match(r"(\d+) of (\d+) stand after Holm", note)
            stands = m["word"] == "holds" and (cites_standing(note) or (
                k_of_n is not None and k_of_n[1] == k_of_n[2]))
            if strong_words(m["text"]) and not stands:
                bad.append(line)
        # the row's own words (what ran, and the paper's verdict cell aside) carry no strong word of ours
        bad += [f"{cells[0]}: {w}" for w in strong_words(cells[2])]
    assert seen > 50, "the summary's verdict lines were not found"
    assert not bad, "\n".join(bad)


def _without_generated(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"<!-- [\w-]+: computed by", line):
            inside = True
        elif re.match(r"<!-- end of [\w-]+ -->", line):
            inside = False
        elif not inside and not re.match(r" {4,}|\|", line):  # code and tables aside
            out.append(line)
            continue
        out.append("")
    return "\n".join(out)


def sentences(text: str) -> list[tuple[int, str]]:
    """(line, sentence) of the prose: paragraphs and list items, split after '.', '!' or '?' (and what closes
    there: a quote, emphasis, a bracket) before a capital."""
    out, para, start = [], [], 0
    lines = _without_generated(text).splitlines() + [""]
    for i, line in enumerate(lines, 1):
        item = re.match(r"\s*(?:[-*] |\d+\. |#+ )", line)
        if (not line.strip() or item) and para:
            joined = re.sub(r"([.!?][*_)\"”]*)\s+(?=[A-Z*\"(“])", "\\1\n", " ".join(para))
            out += [(start, s) for s in joined.split("\n")]
            para = []
        if line.strip():
            if not para:
                start = i
            para.append(line.strip())
    return out


def _prose_pages() -> list[Path]:
    return [DOC, *sorted(REPRO.glob("pages/*.md")), *sorted(REPRO.glob("*/README.md")),
            *sorted(REPRO.glob("*/report.md"))]


# the rule's word used as a verdict of ours: "**holds**", "p = 0.008: holds"
HOLDS = re.compile(r"\*\*holds\*\*|: holds\b")


@pytest.mark.parametrize("page", _prose_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_sentence_that_says_holds_says_whether_it_stands_after_holm(page):
    """'holds' is the rule's word at 5% per test; among a folder's many tests a reader needs the family-wise word
    beside it, so a sentence that gives a verdict as 'holds' says whether it stands after Holm."""
    bad = [f"{page.name}:{n}: {s}" for n, s in sentences(page.read_text()) if HOLDS.search(s) and "Holm" not in s]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", _prose_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_sentence_with_a_strong_word_cites_a_verdict_standing_after_holm(page):
    """Every sentence of the prose with a headline word of ours names, in the same sentence, a verdict that stands
    after Holm ('stands after Holm', or Holm's p below 0.05); else it says its scope in plain words."""
    bad = [f"{page.name}:{n}: {s}" for n, s in sentences(page.read_text()) if strong_words(s) and not cites_standing(s)]
    assert not bad, "\n".join(bad)


def test_every_summary_row_says_its_budget():
    """Each row of the summary carries its budget beside its scale: tuned (trials × rounds) or untuned, and where
    the untuned values came from."""
    entries = tomllib.loads((REPRO / "summary.toml").read_text())["row"]
    missing = [e["paper"] for e in entries if not re.search(r"\b(untuned|tuned)\b", e.get("budget", ""))]
    assert not missing, missing


# the ordering verb of a verdict that stands: "A beats B"; below that, "A ends above B (holds, not after Holm)"
BEATS = re.compile(r"\bbeats?\b|\bbeating\b", re.IGNORECASE)
# a clause that names a claim rather than states it: its verdict is given as not shown / contradicted / no runs,
# or it speaks of "the claim that ..."
NAMED_CLAIM = re.compile(r"not shown|contradicted|no runs|claim that", re.IGNORECASE)


def beats_unbacked(sentence: str) -> bool:
    """Whether ``sentence`` says "beats" as ours, outside quotes and not negated, without a verdict standing after
    Holm in it and without naming a claim (``NAMED_CLAIM``). (A sentence of several verdicts passes with one that
    stands: the words of each are the writer's care.)"""
    bare = QUOTED.sub(lambda m: " " * len(m.group()), sentence)
    return (any(not NEGATED.search(bare[:m.start()]) for m in BEATS.finditer(bare))
            and not cites_standing(sentence) and not NAMED_CLAIM.search(sentence))


def test_the_ordering_verb_follows_the_verdict_that_stands():
    """'beats' only where the verdict stands after Holm; "ends above (holds, not after Holm)" where it holds at 5%
    alone; a claim not shown or contradicted may be named by its words."""
    assert beats_unbacked("FSL-500 beats it (holds, not after Holm).")
    assert not beats_unbacked("FSL-500 ends above it (holds, not after Holm).")
    assert not beats_unbacked("FSL beats FedDF by +0.2 (p = 0.001, Holm 0.008).")
    assert not beats_unbacked("FSL beats FSL-p is **not shown** (p = 0.080).")
    assert not beats_unbacked("the claim that it beats FSL is contradicted, p = 0.004 against")
    assert not beats_unbacked('the paper says "FSL beats FedDyn", here not shown')


@pytest.mark.parametrize("page", _prose_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_sentence_that_says_beats_cites_a_verdict_standing_after_holm(page):
    bad = [f"{page.name}:{n}: {s}" for n, s in sentences(page.read_text()) if beats_unbacked(s)]
    assert not bad, "\n".join(bad)


# a sentence giving a cause: backed by a measurement or an ablation it names, or worded as our reading
CAUSAL = re.compile(r"\b(?:is why|explains?|explained by|thanks to|is caused by|the reason (?:is|was)|"
                    r"accounts? for|because of)\b", re.IGNORECASE)
BACKED = re.compile(r"\b(?:our reading|untested|measured|ablation|diagnostic)", re.IGNORECASE)


@pytest.mark.parametrize("page", _prose_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_sentence_that_gives_a_cause_names_its_evidence_or_says_it_is_a_reading(page):
    """Causes are hypotheses until tested: a sentence that explains a result ('is why', 'explains', 'thanks to', ...)
    either names what measured it (a diagnostic, an ablation) or says it is our reading, untested."""
    bad = [f"{page.name}:{n}: {s}" for n, s in sentences(page.read_text()) if CAUSAL.search(s) and not BACKED.search(s)]
    assert bad == [], "\n".join(bad)
