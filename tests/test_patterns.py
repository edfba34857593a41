"""The one rule of the pattern tables ([overrides], [record_only], [gross_change.factors]):
the most specific matching pattern wins, whatever the file order; and lookups stay fast with
100,000 rules (issue 27)."""
from __future__ import annotations

import fnmatch
import time

from hypothesis import given, strategies as st

from perfgate.cli import main
from perfgate.store.settings import load_settings
from perfgate.judge.patterns import PatternTable, literal_prefix
from perfgate.store import results as results_mod
from perfgate.judge.metric_result import area_of
from perfgate.judge.metrics import summarize
from perfgate.judge.metric_result import MetricResult

TID = "perf/serving/test_decode.py::test_decode[cpu-C=8]"


def pick(rules: dict, test_id: str = TID, metric: str = "ttft_ms"):
    return PatternTable(rules).lookup(test_id, metric)


def test_an_exact_test_id_beats_any_glob():
    plain = "perf/offload/test_reads.py::test_parallel"
    assert pick({"perf/offload/*@ttft_ms": "glob@metric", plain: "exact"}, plain) == "exact"
    # a test id's "[" opens a glob class: written as "[[]" it is the literal, and the pattern exact
    assert pick({"perf/serving/test_decode.py::test_decode[[]cpu-C=8]": "exact, bracket escaped",
                 "perf/serving/test_decode.py::*@ttft_ms": "glob@metric"}) == "exact, bracket escaped"


def test_a_metric_part_beats_none_then_the_longer_literal_prefix_wins():
    assert pick({"perf/serving/*@*": "glob@any", "perf/serving/test_decode.py::*": "longer glob"}) == "glob@any"
    assert pick({"perf/serving/test_decode.py::*@*": "longer", "perf/*@*": "shorter"}) == "longer"
    assert pick({"perf/*": "shorter", "perf/serving/*": "longer"}) == "longer"
    # "[[]" counts as one literal character of the prefix
    assert pick({"perf/serving/test_decode.py::test_decode*": "plain", "perf/serving/test_decode.py::test_decode[[]*":
                 "one more literal"}) == "one more literal"


def test_then_an_exact_metric_then_the_longer_metric_prefix_then_the_later_rule():
    assert pick({"perf/serving/*@ttft_ms": "exact metric", "perf/serving/*@ttft*": "metric glob"}) == "exact metric"
    assert pick({"perf/serving/*@t*": "short", "perf/serving/*@ttft*": "long"}) == "long"
    assert pick({"perf/serving/*@*_ms": "first", "perf/serving/*@*ms": "second"}) == "second"  # tie: later wins
    assert pick({"perf/serving/*@*ms": "first", "perf/serving/*@*_ms": "second"}) == "second"


def test_no_match_and_split_at_the_first_at_sign():
    assert pick({"perf/training/*": 1.0}) is None
    table = PatternTable({"perf/serving/*@slo_attainment@1*x": 0.15})  # metric names may hold '@'
    assert table.lookup(TID, "slo_attainment@1.25x") == 0.15 and table.lookup(TID, "slo_attainment@0.5x") is None


def test_every_table_reads_the_rule_and_a_machine_file_beats_the_project_at_equal_specificity(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.perfgate.overrides]\n"perf/serving/*@*_ms" = 0.30\n"perf/serving/test_decode.py::*" = 0.20\n'
        '[tool.perfgate.record_only]\n"perf/serving/*" = "project"\n')
    hw = tmp_path / "baselines" / "cpu-X-avx2-2c"
    hw.mkdir(parents=True)
    (hw / "tolerances.toml").write_text(
        '[overrides]\n"perf/serving/*@*_ms" = 0.45\n'  # same pattern: replaces the value
        '"perf/*@ttft_ms" = 0.60\n'  # metric exact, shorter prefix: loses to the longer prefix above
        '[record_only]\n"perf/serving/test_decode.py::*" = "machine"\n'
        '[gross_change.factors]\n"perf/*" = 9.0\n"perf/serving/test_decode.py::*@ttft_ms" = 20.0\n"perf/serving/*" = 5.0\n')
    s = load_settings(tmp_path, hardware_id="cpu-X-avx2-2c")
    assert s.override_for(TID, "ttft_ms") == 0.45
    assert s.override_for(TID, "tokens_per_s") == 0.20
    assert s.record_only_reason(TID, "ttft_ms") == "machine"  # longer prefix, although the project's came first
    assert s.gross_change.factor_for(TID, "ttft_ms") == 20.0 and s.gross_change.factor_for(TID, "itl_ms") == 5.0


def test_the_table_is_the_mapping_it_replaced():
    table = PatternTable({"a*": 1.0})
    assert table == {"a*": 1.0} and table.lookup("ab", "m") == 1.0
    table["ab"] = 2.0  # a later insert re-indexes
    assert table.lookup("ab", "m") == 2.0 and len(table) == 2
    del table["ab"]
    assert table.lookup("ab", "m") == 1.0


GLOB_CHARS = st.sampled_from(list("ab[]!*?-@"))


@given(st.text(GLOB_CHARS, max_size=8), st.text(st.sampled_from(list("ab[]!*?-")), max_size=6),
       st.text(st.sampled_from(list("ab[]!-@")), max_size=4))
def test_property_matching_is_fnmatch_on_each_part(pattern, test_id, metric):
    """A pattern matches exactly when fnmatch matches its test part to the test id and its metric part
    (after the first '@') to the metric; the literal prefix starts every match."""
    test, sep, metric_glob = pattern.partition("@")
    expected = fnmatch.fnmatchcase(test_id, test) and (not sep or fnmatch.fnmatchcase(metric, metric_glob))
    assert (PatternTable({pattern: 1}).lookup(test_id, metric) == 1) == expected
    literal, exact = literal_prefix(test)
    if fnmatch.fnmatchcase(test_id, test):
        assert test_id.startswith(literal) and (not exact or test_id == literal)


def many_rules(n: int) -> dict[str, float]:
    return {f"perf/area{i % 50}/test_mod{i}.py::test_case[[]*-{i}]@metric_{i % 7}": round(0.01 * (1 + i % 90), 2)
            for i in range(n)}


def test_100k_rules_look_up_fast():
    """Issue 27: 100,000 rules took ~20 s per metric (fnmatch's pattern cache holds 32,768, so every
    lookup recompiled them all). Indexed, a lookup examines only the rules whose literal parts fit."""
    rules = many_rules(100_000)
    table = PatternTable(rules)
    started = time.process_time()
    for i in range(0, 100_000, 500):
        want = rules[f"perf/area{i % 50}/test_mod{i}.py::test_case[[]*-{i}]@metric_{i % 7}"]
        assert table.lookup(f"perf/area{i % 50}/test_mod{i}.py::test_case[gloo-{i}]", f"metric_{i % 7}") == want
        assert table.lookup(f"perf/area{i % 50}/test_mod{i}.py::test_case[gloo-{i}]", "other") is None
    spent = time.process_time() - started
    assert table.examined <= 2 * 200 * 2  # at most a rule or two per lookup, not 100,000
    assert spent < 10, f"200 x 2 lookups over 100k rules took {spent:.1f} s of CPU (index built once)"


def test_perfgate_compare_with_100k_override_rules(tmp_path, capsys):
    """The user's path: a tolerances.toml of 100,000 rules and `perfgate compare` over 40 metrics."""
    hw = "cpu-Big-avx2-2c"
    rules = many_rules(100_000)
    (tmp_path / "baselines" / hw).mkdir(parents=True)
    (tmp_path / "baselines" / hw / "tolerances.toml").write_text(
        "[overrides]\n" + "\n".join(f'"{k}" = {v}' for k, v in rules.items()) + "\n")
    ids = [(f"perf/area{i % 50}/test_mod{i}.py::test_case[gloo-{i}]", f"metric_{i % 7}") for i in range(0, 100_000, 2500)]

    def doc(scale: float) -> dict:
        rs = [MetricResult(test_id=t, area=area_of(t), metric=m, unit="x", better="higher", tol=0.1,
                           gated=True, summary=summarize([scale * 2.0] * 5), verdict={}) for t, m in ids]
        return results_mod.make_document(rs, hardware_id=hw, fingerprint={}, commit="c")
    results_mod.save(tmp_path / "a.json", doc(1.0))
    results_mod.save(tmp_path / "b.json", doc(1.0))
    started = time.process_time()
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--root", str(tmp_path),
                 "--table", "off"]) == 0
    spent = time.process_time() - started
    assert spent < 30, f"perfgate compare of 40 metrics under 100k rules took {spent:.1f} s of CPU"
