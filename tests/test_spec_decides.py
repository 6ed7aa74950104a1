"""The algorithm's ``Spec`` decides, not its name: no code outside ``fedsl.algorithms`` branches on an algorithm name.

What depends on the algorithm (its η0 default, what it reads, what it refuses) is a declared field or hook of its
``fedsl.algorithms.spec.Spec``, so that a new algorithm is one module and its spec, and no ``if name == ...`` elsewhere
has to learn of it. Read from the source with ``ast`` (nothing is run), this finds, in every module of ``src/fedsl``
outside ``algorithms/``:

- a comparison (``==``, ``!=``, ``in``, ``not in``) with an algorithm name among its operands, or among the elements
  of a tuple, list or set operand (``name in ("feddu", "ds")``);
- a dict literal with an algorithm name as a key (a table keyed by names), and ``.get("name")`` /
  ``.pop("name")`` lookups;
- a ``match`` case on an algorithm name.

The names are the registry's (``fedsl.algorithms.SPECS``). Setting a name (``"algorithm.name": "fedavg"``, a
default or a message) is not a branch. An exception is listed in ``EXCEPTIONS`` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fedsl.algorithms import SPECS, make_rule

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedsl"
NAMES = frozenset(SPECS)

# module path under src/fedsl -> why its name-keyed constructs are allowed
EXCEPTIONS: dict[str, str] = {
    "report/plots.py": "METHOD_COLOURS colours curves by the method a run's *name* starts with ('FL', 'FSLsyn' "
                       "are labels, no algorithms); it never reads algorithm.name",
}


def _names_in(node: ast.AST) -> set[str]:
    """The algorithm names ``node`` is, or holds as the elements of a tuple, list or set display."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def branches(source: str) -> list[tuple[int, str]]:
    """Each branch on an algorithm name in ``source``: (line, what it is)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                hit = set().union(*(_names_in(x) for x in (node.left, *node.comparators)))
                if hit:
                    found.append((node.lineno, f"comparison with {sorted(hit)}"))
        elif isinstance(node, ast.Dict):
            hit = set().union(*(_names_in(k) for k in node.keys if k is not None))
            if hit:
                found.append((node.lineno, f"dict keyed by {sorted(hit)}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop") and node.args and _names_in(node.args[0])):
            found.append((node.lineno, f".{node.func.attr}({sorted(_names_in(node.args[0]))[0]!r})"))
        elif isinstance(node, ast.match_case):
            hit = {n.value.value for n in ast.walk(node.pattern) if isinstance(n, ast.MatchValue)
                   and isinstance(n.value, ast.Constant) and n.value.value in NAMES}
            if hit:
                found.append((node.pattern.lineno, f"match case {sorted(hit)}"))
    return sorted(found)


def test_no_branch_on_an_algorithm_name_outside_algorithms():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("algorithms/") or rel in EXCEPTIONS:
            continue
        bad += [f"{rel}:{line}: {what}" for line, what in branches(path.read_text())]
    assert not bad, ("branches on an algorithm name outside fedsl.algorithms (declare what the name stands for as a "
                     "field or hook of the rule's Spec instead):\n" + "\n".join(bad))


def test_the_checker_sees_branches():
    """Each form the test looks for is found (so the test above can fail), and setting a name is not a branch."""
    source = '''
if a.name == "feddu": pass
if "ds" != name: pass
if alg.name in ("feddu", "ds"): pass
if name not in ["scaffold"]: pass
REFUSED = {"scaffold": "why", "other": 1}
reason = REFUSED.get(alg.name) or TABLE.get("fednova")
match name:
    case "fedprox" | "moon":
        pass
    case _:
        pass
DEFAULTS = {"algorithm.name": "fedavg"}
cfg["algorithm"]["name"] = "fedavg"
if name == "feddu_decay" or key in ("seed", "mean"): pass
'''
    found = [line for line, _ in branches(source)]
    assert found == [2, 3, 4, 5, 6, 7, 9], branches(source)


def test_every_exception_is_still_needed():
    for rel in EXCEPTIONS:
        assert branches((PACKAGE / rel).read_text()), f"{rel} no longer branches on a name: drop its exception"


def test_a_spec_declares_the_hooks_its_rule_has():
    """What validation reads from the spec and what the round calls on the rule agree: ``sets_gamma`` with the rule's
    ``server_gamma`` hook, ``needs_representation`` with its ``local_loss``; only a rule that sets γ_t reads label
    counts for it."""
    for name, sp in SPECS.items():
        rule = make_rule(name, 1.0)
        assert sp.sets_gamma == (getattr(rule, "server_gamma", None) is not None), name
        assert sp.needs_representation == (getattr(rule, "local_loss", None) is not None), name
        assert sp.sets_gamma or not sp.reads_label_counts, name
