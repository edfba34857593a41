"""Which folder of perfgate may import which: types in the judge, files in the store, people in the commands.

The judge decides over numbers and owns its types (MetricResult, BaselineEntry); the store reads and
writes files of them; reports and commands speak to people. An import that runs back up (the judge
reaching into the store for a type, the store into a report for a name, or asking a person a question)
ties the layers into one knot, so each rule is checked over every import statement of every module,
function-level imports included.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfgate"

# folder -> the perfgate modules or folders it must never import
FORBIDDEN = {
    "judge": ("perfgate.store", "perfgate.report", "perfgate.commands", "perfgate.cli", "perfgate.plugin",
              "perfgate.session", "perfgate.launch", "perfgate.workloads", "perfgate.interrupts"),
    "store": ("perfgate.report", "perfgate.commands", "perfgate.cli", "perfgate.plugin", "perfgate.session"),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in ``path``; ``from a import b`` names both ``a`` and ``a.b``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def violations(folder: str) -> list[str]:
    bad = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for line, name in imported_modules(path):
            hit = next((f for f in FORBIDDEN[folder] if name == f or name.startswith(f + ".")), None)
            if hit:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return sorted(set(bad))


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_a_layer_never_imports_the_layers_above_it(folder):
    assert violations(folder) == []


def test_the_rule_sees_a_function_level_import(tmp_path, monkeypatch):
    """The check itself: an import inside a function (how the old circle hid) is found."""
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "x.py").write_text("def f():\n    from perfgate.store.results import load\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert violations("judge") == [f"{tmp_path.name}/judge/x.py:2 imports perfgate.store.results",
                                   f"{tmp_path.name}/judge/x.py:2 imports perfgate.store.results.load"]


def test_the_store_asks_no_one_and_handles_no_signals():
    """A ``[y/N]`` prompt belongs to a command, signal handling to the process (perfgate.interrupts)."""
    for path in sorted((PACKAGE / "store").rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "input" not in calls, path
        assert all(name != "signal" for _, name in imported_modules(path)), path
