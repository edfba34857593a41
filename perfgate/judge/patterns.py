"""The one rule for ``test_id_glob[@metric_glob]`` tables: the most specific matching pattern wins.

Three tables use it: tolerance ``[overrides]``, ``[record_only]`` and ``[gross_change.factors]``
(perfgate.judge.config, perfgate.judge.guard). Until 2026-12-02 the first read the ``@metric``
patterns first, the other two took the first match in file order, and the docs said "first
match wins"; one table of rules now means one way to read it.

A pattern is split at its first ``@`` into a test part and an optional metric part (test ids
hold no ``@``; metric names may: ``slo_attainment@1x``). Each part is an fnmatch glob, and
``[[]``-style one-character classes count as literal characters. Specificity, compared in
this order (the first difference decides):

1. an exact test id (no wildcard in the test part) beats a glob;
2. a pattern with a metric part beats one without;
3. the longer literal prefix of the test part (the characters before its first wildcard);
4. an exact metric name beats a metric glob;
5. the longer literal prefix of the metric part;
6. tie: the rule read later wins (files are read pyproject.toml, then
   ``baselines/tolerances.toml``, then the machine's own ``tolerances.toml``, so a machine's
   file beats the project's at equal specificity).

Lookups are indexed (issue 27: 100,000 rules took ~20 s per metric, every pattern recompiled
by fnmatch's bounded cache on every lookup): rules are bucketed by exact test id or by the
literal prefix of their test part, then by exact metric name, so a lookup examines only the
rules whose literal parts already fit; globs compile once, on first use; answers are cached.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import MutableMapping
from typing import Any, Iterator

# The literal start of a glob: plain characters and one-character classes such as "[[]" or "[*]"
# (not "[!x]", which excludes; fnmatch reads "[]]" as a literal "]").
_LITERAL_START = re.compile(r"(?:[^*?[]|\[[^!]\])*")
_ONE_CHAR_CLASS = re.compile(r"\[([^!])\]")
_PLAIN_START = re.compile(r"[^*?[]*")


def literal_prefix(glob: str) -> tuple[str, bool]:
    """(the characters every match starts with, whether the glob matches only that string)."""
    head = _LITERAL_START.match(glob).group()
    literal = _ONE_CHAR_CLASS.sub(lambda m: m.group(1), head) if "[" in head else head
    return literal, len(head) == len(glob)


class _Rule:
    """One pattern. Only what indexing needs is worked out when the table is built; the rest
    (specificity, compiled globs) when a lookup first meets the rule."""

    def __init__(self, pattern: str, value: Any, order: int):
        self.pattern, self.value, self.order = pattern, value, order
        self.test, sep, metric = pattern.partition("@")
        self.metric = metric if sep else None
        self.metric_literal, self.metric_exact = literal_prefix(metric) if sep else ("", False)
        plain = _PLAIN_START.match(self.test).end()
        self.test_exact = plain == len(self.test) or _LITERAL_START.match(self.test).end() == len(self.test)
        # an exact test id is its own bucket; a glob's plain start is a prefix of every test id it matches
        self.bucket = literal_prefix(self.test)[0] if self.test_exact else self.test[:plain]
        self._specificity: tuple | None = None
        self._regex: tuple | None = None

    @property
    def specificity(self) -> tuple:
        if self._specificity is None:
            test_literal = literal_prefix(self.test)[0]
            self._specificity = (self.test_exact, self.metric is not None, len(test_literal), self.metric_exact,
                                 len(self.metric_literal), self.order)
        return self._specificity

    def matches(self, test_id: str, metric: str) -> bool:
        if self._regex is None:
            self._regex = (None if self.test_exact else re.compile(fnmatch.translate(self.test)),
                           None if self.metric is None or self.metric_exact
                           else re.compile(fnmatch.translate(self.metric)))
        t_re, m_re = self._regex
        if (test_id != self.bucket) if t_re is None else not t_re.match(test_id):
            return False
        if self.metric is None:
            return True
        return metric == self.metric_literal if m_re is None else bool(m_re.match(metric))


class _Bucket:
    """Rules sharing one test literal: those naming an exact metric apart, by metric."""

    def __init__(self):
        self.by_metric: dict[str, list[_Rule]] = {}
        self.other: list[_Rule] = []

    def add(self, rule: _Rule) -> None:
        if rule.metric is not None and rule.metric_exact:
            self.by_metric.setdefault(rule.metric_literal, []).append(rule)
        else:
            self.other.append(rule)

    def candidates(self, metric: str) -> list[_Rule]:
        return self.by_metric.get(metric, []) + self.other


class PatternTable(MutableMapping):
    """``pattern -> value`` in the order read, answering :meth:`lookup` by the rule above.

    A mapping so that the settings readers and tests fill it like the dict it replaced."""

    def __init__(self, data: dict | None = None):
        self._data: dict[str, Any] = {}
        self._index: tuple[dict[str, _Bucket], dict[str, _Bucket], list[int]] | None = None
        self._answers: dict[tuple[str, str], Any] = {}
        self.examined = 0  # rules matched against by lookups so far: the index's work, for tests
        if data:
            self.update(data)

    def __getitem__(self, pattern: str) -> Any:
        return self._data[pattern]

    def __setitem__(self, pattern: str, value: Any) -> None:
        if not isinstance(pattern, str):
            raise TypeError(f"a pattern must be a string, got {pattern!r}")
        self._data[pattern] = value
        self._index = None

    def __delitem__(self, pattern: str) -> None:
        del self._data[pattern]
        self._index = None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"PatternTable({self._data!r})"

    def _built(self):
        if self._index is None:
            exact: dict[str, _Bucket] = {}
            by_prefix: dict[str, _Bucket] = {}
            for order, (pattern, value) in enumerate(self._data.items()):
                rule = _Rule(pattern, value, order)
                (exact if rule.test_exact else by_prefix).setdefault(rule.bucket, _Bucket()).add(rule)
            self._index = (exact, by_prefix, sorted({len(p) for p in by_prefix}))
            self._answers = {}
        return self._index

    def lookup(self, test_id: str, metric: str) -> Any | None:
        """The value of the most specific pattern matching ``test_id`` and ``metric``, or None."""
        exact, by_prefix, lengths = self._built()
        key = (test_id, metric)
        if key in self._answers:
            return self._answers[key]
        buckets = [exact.get(test_id)] + [by_prefix.get(test_id[:n]) for n in lengths if n <= len(test_id)]
        best: _Rule | None = None
        for bucket in buckets:
            if bucket is None:
                continue
            for rule in bucket.candidates(metric):
                self.examined += 1
                if (best is None or rule.specificity > best.specificity) and rule.matches(test_id, metric):
                    best = rule
        self._answers[key] = None if best is None else best.value
        return self._answers[key]
