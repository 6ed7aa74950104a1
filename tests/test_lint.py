"""The linter CI runs: ``ruff check`` with the project's rules (``[tool.ruff]`` in pyproject.toml, line length 120)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTED = ["src", "tests", "benchmarks", "reproduction", "docs", "examples"]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")  # the [test] extra pins it; a bare install skips
    # --no-cache: nothing written into the checkout
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *LINTED],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


# Code and the docs generated from it (the config reference is built from the field descriptions) say what
# is true of the code, not when it was asked for or how fast it ran once: issue numbers, talk of a design
# sketch, and hardware timings age. Timings live in benchmarks/RESULTS*.md, issue history in the tracker.
_UNIT = r"(?:ms|µs|us|s|sec|seconds?|min|minutes?|hours?)"
_NUMBER_WITH_UNIT = re.compile(rf"(?<![\w.])~?\d(?:[\d.,]*\d)?(?:-\d(?:[\d.,]*\d)?)?\s*{_UNIT}\b")
_TIMING_CONTEXT = re.compile(r"measured|took|\btake\b|faster|slower|\bcores?\b|\bGPU\b|\bH[12]00\b|\bCPU\b|against"
                             r"|worker|per run|per z\b|per evaluated|loaded machine|starts in|spends", re.I)
_SPEEDUP = re.compile(r"\d+(?:\.\d+)?\s*[x×]\s+(?:faster|slower)|\d+%\s+(?:faster|slower)|saved \d+%|GFLOP/s", re.I)
_AGES = re.compile(r"\bissues?\s+#?\d+|\bPR\s+#?\d+|design sketch|(?-i:ARCHITECTURE\.md)", re.I)


def aging_phrases(text: str, code: bool = True) -> list[str]:
    """The phrases of ``text`` that age: issue numbers and design talk, and (``code``) hardware timings,
    read across line breaks, comment marks and string-literal joins."""
    flat = re.sub(r"\s+", " ", re.sub(r"""["']?\s*\n\s*(?:#\s*)?["']?""", " ", text))
    found = [m.group(0) for m in _AGES.finditer(flat)]
    if code:
        found += [m.group(0) for m in _SPEEDUP.finditer(flat)]
        found += [m.group(0) for m in _NUMBER_WITH_UNIT.finditer(flat)
                  if _TIMING_CONTEXT.search(flat[max(0, m.start() - 80):m.end() + 80])]
    return found


def test_code_and_generated_docs_do_not_age():
    bad = []
    for path in sorted((ROOT / "src" / "fedsl").rglob("*")):
        # a preset's description may say how long it runs (like the README); it names no issue
        if path.suffix in (".py", ".toml"):
            bad += [f"{path.relative_to(ROOT)}: {p!r}" for p in aging_phrases(path.read_text(), path.suffix == ".py")]
    for path in sorted((ROOT / "docs").rglob("*.md")):
        bad += [f"{path.relative_to(ROOT)}: {p!r}" for p in aging_phrases(path.read_text(), code=False)]
    assert not bad, "phrases that age (timings go to benchmarks/RESULTS*.md):\n" + "\n".join(bad)


def test_the_aging_check_sees_what_it_forbids():
    assert aging_phrases("# 20 onwards: issue 29's rules") == ["issue 29"]
    assert aging_phrases('"On a busy machine 1 thread ran CIFAR rounds 10x "\n    "faster than 2."') == ["10x faster"]
    assert aging_phrases("(60 CNNs: 0.33 s against 0.43 s)") == ["0.33 s", "0.43 s"]
    assert aging_phrases("5 steps, ~0.3 s) spends a few ms per call") == ["~0.3 s"]
    assert aging_phrases("the md5s against both publishers'") == []
    assert aging_phrases("else 30 minutes (seconds, > 0)") == []
    assert aging_phrases("polls every ``poll`` seconds (Flower's: 3 s)") == []
    assert aging_phrases("see the design sketch", code=False) == ["design sketch"]
    assert aging_phrases("min(1, min(a, b)); docs/explanations/architecture.md") == []
