"""The one session cache of workload results, shared by every perf test through the `runs` fixture.

Starting ranks or a server costs seconds, so one launch measures many cases and each test
reads its own. A test asks ``runs.get(key, produce)``; the first asker pays for ``produce()``,
later askers read the stored result. ``runs.get_many(keys, produce, batch=...)`` does the
same for several keys at once, and on a miss produces every missing key of ``batch`` in one
call (one launch for a whole sweep).

Re-measurement: the plugin re-runs a test whose gated metric looks like a regression. Before
it does, it calls :meth:`RunCache.invalidate` for that test, which drops exactly the entries
the test read, so the re-run produces fresh samples for them (and only them); tests that run
later read the fresh entries too. No test needs to know whether it is being re-measured.

Selection: after collection the plugin hands over the ``case`` values of the tests this
session will run (:attr:`RunCache.selected_cases`); an area may narrow a batch to what they
read, so that ``pytest -k 'one case'`` launches that case and not its whole job. ``None``
(not known, e.g. a test that builds its own cache) keeps the whole batch.

Taint: each producer call runs in a window of the session's LoadWatch (perfgate.machine.
load_watch), and the reasons found there (a foreign job busy while the launch measured) stay
with the entries it made; :meth:`RunCache.taint_of` gives a test the reasons of every entry
it read, whether it produced them or read them from an earlier test's launch, and
:meth:`RunCache.foreign_cores_of` how much CPU others took in the busiest of those launches.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from perfgate.machine.load_watch import WHILE_LAUNCH, LoadWatch


class RunCacheError(RuntimeError):
    """A producer did not return what the cache asked for."""


class RunCache:
    def __init__(self, watch: LoadWatch | None = None) -> None:
        self._watch = watch or LoadWatch(enabled=False)
        self._entries: dict[Hashable, Any] = {}
        self._taint: dict[Hashable, list[str]] = {}
        self._foreign: dict[Hashable, float | None] = {}  # cores others took while each entry was made
        self._used: dict[str, set[Hashable]] = {}
        self._test: str | None = None
        self.produced = 0  # calls of a producer: how many launches the session paid for
        self.selected_cases: tuple | None = None  # the selected tests' ``case`` values; None: not known

    def begin(self, test_id: str | None) -> None:
        """The plugin says which test runs now, so reads are charged to it."""
        self._test = test_id

    def _mark(self, keys: Iterable[Hashable]) -> None:
        if self._test is not None:
            self._used.setdefault(self._test, set()).update(keys)

    def get(self, key: Hashable, produce: Callable[[], Any]) -> Any:
        """The cached result for ``key``; ``produce()`` makes it on the first ask."""
        self._mark([key])
        if key not in self._entries:
            self.produced += 1
            with self._watch.window(WHILE_LAUNCH) as window:
                value = produce()
            self._entries[key], self._taint[key], self._foreign[key] = value, window.reasons, window.foreign_cores
        return self._entries[key]

    def get_many(self, keys: Sequence[Hashable], produce: Callable[[tuple], Mapping[Hashable, Any]],
                 *, batch: Iterable[Hashable] = ()) -> list[Any]:
        """Results for ``keys``, in order. On a miss, ``produce(missing)`` is called once with every
        key of ``keys`` and ``batch`` not cached yet and must return a mapping with each of them.
        Only ``keys`` count as read by the test (``batch`` is what is worth measuring together)."""
        self._mark(keys)
        missing = tuple(dict.fromkeys(k for k in (*keys, *batch) if k not in self._entries))
        if any(k not in self._entries for k in keys):
            self.produced += 1
            with self._watch.window(WHILE_LAUNCH) as window:
                made = produce(missing)
            lacking = [k for k in missing if k not in made]
            if lacking:
                raise RunCacheError(f"producer returned no result for {lacking!r} (asked for {missing!r})")
            self._entries.update((k, made[k]) for k in missing)
            self._taint.update((k, window.reasons) for k in missing)
            self._foreign.update((k, window.foreign_cores) for k in missing)
        return [self._entries[k] for k in keys]

    def used_by(self, test_id: str) -> frozenset:
        return frozenset(self._used.get(test_id, ()))

    def taint_of(self, test_id: str) -> list[str]:
        """Why the entries ``test_id`` read were measured on a busy machine (empty: quiet)."""
        return sorted({reason for key in self._used.get(test_id, ()) for reason in self._taint.get(key, ())})

    def foreign_cores_of(self, test_id: str) -> float | None:
        """The most CPU, in cores, that others took while the entries ``test_id`` read were measured;
        None where no launch of them was watched long enough to say."""
        taken = [c for key in self._used.get(test_id, ()) if (c := self._foreign.get(key)) is not None]
        return max(taken, default=None)

    def invalidate(self, test_id: str) -> frozenset:
        """Drop the entries ``test_id`` read, before it is re-measured; returns their keys."""
        keys = frozenset(self._used.pop(test_id, ()))
        for key in keys:
            self._entries.pop(key, None)
            self._taint.pop(key, None)
            self._foreign.pop(key, None)
        return keys
