"""What a metric depends on is said one way (issue 50 §2), and the CPU rule for in-run ratios is one function.

``depends`` decides what a metric is compared with (perfgate.judge.metrics). It was spelt four ways:
``options={"depends": ...}`` in ``Measured``, a module constant ``ON_DEVICE = {"depends": "device"}``,
``STRUCTURAL = {"depends": "nothing"}`` and helper dicts; and "an in-run ratio on CPU depends on the exact
id" was keyed on ``profile.name == "cpu"`` in serving and ``backend == "gloo"`` in MoE. Now ``Measured``
takes ``depends=`` as a field, by the judge's names (DEPENDS_DEVICE...), and the CPU rule is
perfgate.workloads.area.cpu_ratio_depends. These checks read the source, so an old spelling in a branch
no unit test reaches (a GPU-only reduce) is still found.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from perfgate.judge.metrics import DEPENDS, DEPENDS_ID, DEPENDS_NOTHING
from perfgate.workloads import moe, serving
from perfgate.workloads.area import Measured, cpu_ratio_depends

ROOT = Path(__file__).resolve().parents[1]
# where metrics are made: the workloads' reduces, the perf tests and their fixtures, the correctness suite
WHERE = ("perfgate/workloads", "perf", "fixtures", "correctness")


def old_spellings(source: str) -> list[str]:
    """Each place ``source`` says what a metric depends on other than ``depends=<a judge name>``: a dict key
    ``"depends"`` ({"depends": "device"}, dict(depends=...)), a ``depends=`` given a string of its own
    ("device" rather than DEPENDS_DEVICE), or ``options=`` handed to ``Measured``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            bad += [f"{node.lineno}: a dict key 'depends'" for k in node.keys
                    if isinstance(k, ast.Constant) and k.value == "depends"]
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            for kw in node.keywords:
                if kw.arg == "depends" and name == "dict":
                    bad.append(f"{node.lineno}: dict(depends=...)")
                elif kw.arg == "depends" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    bad.append(f"{node.lineno}: depends={kw.value.value!r} (say it by the judge's name)")
                elif kw.arg == "options" and name == "Measured":
                    bad.append(f"{node.lineno}: Measured(options=...)")
    return bad


def _sources():
    for folder in WHERE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT), path.read_text()


def test_every_metric_says_what_it_depends_on_one_way():
    bad = [f"{path}:{hit}" for path, text in _sources() for hit in old_spellings(text)]
    assert bad == []


@pytest.mark.parametrize("old", [
    'ON_DEVICE = MappingProxyType({"depends": "device"})',
    'STRUCTURAL = {"depends": "nothing"}',
    'Measured("graph_time_us", t, "us", "lower", options={"depends": "device"})',
    'Measured("x", s, "x", "lower", options=step_ratio)',
    'timing = dict(depends="host", device_busy=busy)',
    'perf.record("n", [1], unit="count", better="lower", depends="nothing")',
])
def test_the_check_finds_each_old_spelling(old):
    """The check itself: each spelling the workloads used before issue 50 §2 is found."""
    assert old_spellings(old)


def test_the_one_spelling_passes_the_check_and_measured_records_it():
    one = 'Measured("rank_load_max_over_mean", [1.0], "x", "lower", tol=0.0, depends=DEPENDS_NOTHING)'
    assert old_spellings(one) == []
    m = Measured("rank_load_max_over_mean", [1.0], "x", "lower", tol=0.0, depends=DEPENDS_NOTHING)
    assert m.record_kwargs()["depends"] == "nothing" and DEPENDS_NOTHING in DEPENDS


def test_the_cpu_id_rule_is_one_function_that_serving_and_moe_call():
    """Only cpu_ratio_depends names DEPENDS_ID among the workloads, and both areas whose mix ratios it
    governs call it (serving's mix_ratio and MoE's ``backend == "gloo"`` were two conditions)."""
    named = sorted(str(path) for path, text in _sources()
                   if any(isinstance(n, ast.Name) and n.id == "DEPENDS_ID" for n in ast.walk(ast.parse(text))))
    assert named == ["perfgate/workloads/area.py"]
    for module in ("perfgate/workloads/serving/measurements.py", "perfgate/workloads/moe/__init__.py"):
        calls = [n for n in ast.walk(ast.parse((ROOT / module).read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "cpu_ratio_depends"]
        assert calls, f"{module} no longer asks cpu_ratio_depends"


@pytest.mark.parametrize("area, on_cpu", [
    (serving.AREA, lambda c: c.values.profile.name == "cpu"),   # the rule as serving spelt it before
    (moe.AREA, lambda c: c.values.backend == "gloo"),           # as MoE spelt it
], ids=["serving", "moe"])
def test_the_rule_answers_as_each_areas_old_condition_on_every_case(area, on_cpu):
    """The marks the rule reads agree, on every case of every kind, with what each area called a CPU run:
    every recorded ``depends`` stays as it was. A case marked ``cpu`` that runs on a GPU fails here."""
    kinds = {c.kind for p in area.profiles.values() for c in area.cases(p)}
    every = [c for k in kinds for c in area.all_cases(k)]
    assert every and any(on_cpu(c) for c in every) and not all(on_cpu(c) for c in every)
    assert [c.id for c in every if cpu_ratio_depends(c) != (DEPENDS_ID if on_cpu(c) else None)] == []
