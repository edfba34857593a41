"""`perfgate ab [options] [--] PYTEST_ARGS`: same-machine A/B of two environments, interleaved.

"Does this NCCL / torch / driver upgrade cost anything?" Comparing against a baseline from
another run, sitting or day mixes the upgrade with that run's offset. Here both stacks run in
one session on one machine: A and B are two Python interpreters (venvs) or two sets of
environment variables, each round runs the selection once under each (A B, then B A, ...)
as a real pytest subprocess with ``--perf-save``, and each metric is gated on the paired
per-round ratio of its medians with a Student t interval over rounds (perfgate/judge/ab_stats.py).

Results file (``--save``), table and exit code are those of a normal run: 1 when any metric
is a regression, 0 otherwise, 2 on a usage or run error.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perfgate.judge import ab_stats
from perfgate.store import results as results_mod
from perfgate.judge.metric_result import metric_results
from perfgate.judge.metrics import MAX_TOLERANCE, summarize
from perfgate.commands import pytest_run
from perfgate.options import number, output_file, output_folder
from perfgate.report.run_report import metric_table, regression_line
from perfgate.report.textable import stdout_width
from perfgate.judge.metric_result import MetricResult, area_of

_OWN_OPTIONS = {"--a-python", "--b-python", "--a-env", "--b-env", "--rounds", "--threshold", "--confidence",
                "--save", "--keep", "--root", "--hardware-id", "--time-limit"}


class ABError(ValueError):
    """A round produced no results or the options cannot describe two environments."""


class OutOfTime(ABError):
    """The rounds left cannot finish before the deadline: stopped before starting them.

    An A/B cut short has no verdict, so the rounds it would still run are device time spent for
    nothing (a batch job's time limit, a CI job's timeout). Raised between rounds, never inside one."""

    def __init__(self, needed_s: float, left_s: float, rounds_done: int, rounds: int):
        self.needed_s, self.left_s, self.rounds_done, self.rounds = needed_s, left_s, rounds_done, rounds
        super().__init__(f"stopped after {rounds_done} of {rounds} rounds: the other {rounds - rounds_done} need "
                         f"~{needed_s:.0f} s at the pace so far, {max(left_s, 0):.0f} s are left of the time limit")


# The numbers `perfgate ab` and `perfgate power` take, checked as parsed (options.number), before a round runs.
time_limit = number("the time limit in seconds", above=0)
_at_least_rounds = number("the rounds", at_least=ab_stats.MIN_ROUNDS + ab_stats.MIN_ROUNDS % 2, whole=True,
                          also=", even")


def rounds(text: str) -> int:
    """``--rounds``: even, at least MIN_ROUNDS. Measured: an A = A run of 3 rounds (A B, B A, A B) read B/A
    1.175 [1.160, 1.189] on a quiet machine. Whichever side runs second in a round pays (or gains) the same;
    with as many B-first as A-first rounds that position effect cancels in the geometric mean."""
    value = _at_least_rounds(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: the rounds must be even, so that each side "
                                         f"goes first in as many rounds as the other (the position in a round "
                                         f"biases B/A)")
    return value


rounds.allowed = _at_least_rounds.allowed + ", even"


threshold = number("the threshold (a worsening: 0.03 is 3 %)", at_least=0, at_most=MAX_TOLERANCE)
confidence = number("the confidence", above=0, below=1)


def register(sub) -> None:
    p = sub.add_parser("ab", help="A/B two environments on this machine, interleaved; gate on the paired ratio",
                       description="perfgate ab [options] [--] PYTEST_ARGS (options go before the tests)")
    p.add_argument("--a-python", type=Path, help="interpreter for A (default: this one)")
    p.add_argument("--b-python", type=Path, help="interpreter for B (default: this one)")
    p.add_argument("--a-env", action="append", default=[], metavar="K=V", help="environment variable for A (repeat)")
    p.add_argument("--b-env", action="append", default=[], metavar="K=V", help="environment variable for B (repeat)")
    p.add_argument("--rounds", type=rounds, default=8, help=f"rounds of A+B (default 8): an even number (each side goes first in half of "
                        f"them), at least {ab_stats.MIN_ROUNDS + ab_stats.MIN_ROUNDS % 2}")
    p.add_argument("--threshold", type=threshold, default=ab_stats.DEFAULT_THRESHOLD,
                   help="a regression's whole interval lies beyond this worsening (default 0.03 = 3%%)")
    p.add_argument("--confidence", type=confidence, default=ab_stats.DEFAULT_CONFIDENCE,
                   help="level of the two-sided Student t interval over rounds of the mean log ratio B/A "
                        "(default 0.95)")
    p.add_argument("--save", type=output_file, help="write the A/B results JSON here")
    p.add_argument("--keep", type=output_folder, help="keep each round's results JSON in this folder")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root; pytest runs here")
    p.add_argument("--hardware-id", help="passed to pytest as --perf-hardware-id")
    p.add_argument("--time-limit", type=time_limit, metavar="SECONDS",
                   help="stop (exit 2) before a round that the rounds so far say cannot finish in time, "
                        "rather than spend the time on an A/B with no verdict")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="tests and pytest options, e.g. -m cpu perf/")
    p.set_defaults(func=run)


def parse_env(pairs: list[str], side: str, flag: str | None = None) -> dict[str, str]:
    flag = flag or f"--{side}-env"
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ABError(f"{flag} {pair!r}: expected KEY=VALUE, e.g. {flag} NCCL_PROTO=Simple")
        env[key] = value
    return env


def _python(path: Path | None, side: str) -> str:
    if path is None:
        return sys.executable
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ABError(f"--{side}-python {path}: not an executable file; give a venv's bin/python")
    return str(path)


def run_round(python: str, env_extra: dict[str, str], pytest_args: list[str], save: Path, *, root: Path,
              hardware_id: str | None) -> dict:
    """One pytest run of the selection under one side's environment -> its results document."""
    pytest_run.run_saving(pytest_args, save, root=root, hardware_id=hardware_id, python=python, env_extra=env_extra)
    return results_mod.load(save)


def compare(a_docs: list[dict], b_docs: list[dict], *, threshold: float, confidence: float,
            rerun: str) -> list[MetricResult]:
    """Pair the rounds' documents metric by metric into MetricResults whose baseline is A."""
    def medians(docs):
        out: dict[tuple[str, str], list] = {}
        meta: dict[tuple[str, str], MetricResult] = {}
        for i, doc in enumerate(docs):
            for r in metric_results(doc):
                out.setdefault((r.test_id, r.metric), [None] * len(docs))[i] = r.summary.median
                meta[(r.test_id, r.metric)] = r
        return out, meta

    a_med, a_meta = medians(a_docs)
    b_med, b_meta = medians(b_docs)
    rounds = len(a_docs)
    results = []
    for key in sorted(set(a_med) | set(b_med)):
        r = b_meta.get(key) or a_meta[key]
        a_vals = [x for x in a_med.get(key, []) if x is not None]
        b_vals = [x for x in b_med.get(key, []) if x is not None]
        complete = len(a_vals) == rounds and len(b_vals) == rounds
        base = {"median": float(np.median(a_vals)) if a_vals else None, "n": len(a_vals), "samples": a_vals,
                "mad": summarize(a_vals).mad if a_vals else 0.0, "provenance": "A (per-round medians)",
                "when": a_docs[-1].get("created"), "commit": a_docs[-1].get("commit"),
                "software": (a_docs[-1].get("fingerprint") or {}).get("software"), "source": None}
        verdict = None
        if complete:
            try:
                p = ab_stats.paired(a_vals, b_vals, better=r.better, threshold=threshold, confidence=confidence)
                verdict = {"outcome": p.outcome.value, "change": p.change, "tol": threshold, "p_value": None,
                           "explanation": p.explanation, "change_ci": list(p.change_ci), "ratio": p.ratio,
                           "ratio_ci": list(p.ratio_ci), "ratios": list(p.ratios)}
            except ValueError as exc:
                reason = str(exc)
        else:
            reason = f"measured in {len(a_vals)} A and {len(b_vals)} B of {rounds} rounds: not paired"
        if verdict is None:
            verdict = {"outcome": "new", "change": None, "tol": threshold, "p_value": None, "explanation": reason}
        summary = summarize(b_vals) if b_vals else summarize(a_vals)
        results.append(MetricResult(test_id=r.test_id, area=area_of(r.test_id), metric=r.metric, unit=r.unit,
                                    better=r.better, tol=threshold, gated=verdict["outcome"] != "new",
                                    summary=summary, verdict=verdict, baseline=base if a_vals else None,
                                    rerun=rerun))
    return results


def split_args(pytest_args: list[str], own_options=frozenset(_OWN_OPTIONS), command: str = "ab") -> list[str]:
    if pytest_args and pytest_args[0] == "--":
        return pytest_args[1:]
    ours = sorted({a.split("=")[0] for a in pytest_args} & set(own_options))
    if ours:
        raise ABError(f"{', '.join(ours)} came after the tests and would go to pytest: put perfgate options "
                      f"first, e.g. `perfgate {command} --rounds 8 -- -k test_all_reduce perf/collectives`")
    return list(pytest_args)


def _side_text(python: str, env: dict[str, str]) -> str:
    return " ".join([f"{k}={v}" for k, v in env.items()] + [python])


def measure(sides: dict[str, tuple[str, dict[str, str]]], rounds: int, pytest_args: list[str], *, root: Path,
            hardware_id: str | None = None, keep: Path | None = None,
            deadline: float | None = None) -> tuple[dict[str, list[dict]], str]:
    """Run the rounds (A B, B A, ...) and return each side's results documents and the hardware id.

    ``deadline`` (a ``time.monotonic()`` value): before each round after the first, the mean round
    so far times the rounds left must fit before it, or OutOfTime is raised."""
    docs: dict[str, list[dict]] = {"a": [], "b": []}
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="perfgate-ab-") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i, pair in enumerate(ab_stats.round_order(rounds)):
            if deadline is not None and took:
                needed, left = sum(took) / len(took) * (rounds - i), deadline - time.monotonic()
                if needed > left:
                    raise OutOfTime(needed, left, i, rounds)
            runs = []
            for side in pair:
                python, env = sides[side]
                path = folder / f"round{i + 1}-{side}.json"
                start = time.monotonic()
                docs[side].append(run_round(python, env, pytest_args, path, root=root, hardware_id=hardware_id))
                runs.append(time.monotonic() - start)
            took.append(sum(runs))
            print(f"  round {i + 1}/{rounds} done ({' '.join(s.upper() for s in pair)}) in "
                  f"{' + '.join(f'{s:.0f}' for s in runs)} s", file=sys.stderr)
    hw = {d["hardware_id"] for d in docs["a"] + docs["b"]}
    if len(hw) != 1:
        raise ABError(f"rounds report different hardware ids {sorted(hw)}; an A/B runs on one machine")
    return docs, hw.pop()


def run(args: argparse.Namespace) -> int:
    pytest_args = split_args(list(args.pytest_args))
    sides = {"a": (_python(args.a_python, "a"), parse_env(args.a_env, "a")),
             "b": (_python(args.b_python, "b"), parse_env(args.b_env, "b"))}
    root = args.root.resolve()
    same = sides["a"] == sides["b"]
    print(f"perfgate ab: A = {_side_text(*sides['a'])}\n             B = {_side_text(*sides['b'])}"
          + ("\n             (A and B are the same environment: an A = A check of the noise)" if same else ""),
          file=sys.stderr)
    order = ab_stats.round_order(args.rounds)
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    docs, hardware_id = measure(sides, args.rounds, pytest_args, root=root, hardware_id=args.hardware_id,
                                keep=args.keep, deadline=deadline)
    flags = " ".join([f"--a-env {k}={v}" for k, v in sides["a"][1].items()]
                     + [f"--b-env {k}={v}" for k, v in sides["b"][1].items()]
                     + ([f"--a-python {args.a_python}"] if args.a_python else [])
                     + ([f"--b-python {args.b_python}"] if args.b_python else []))
    rerun = f"perfgate ab {flags} --rounds {args.rounds} -- {' '.join(pytest_args)}"
    results = compare(docs["a"], docs["b"], threshold=args.threshold, confidence=args.confidence,
                      rerun=rerun)
    if not results:
        print("no metrics recorded: the selected tests record nothing")
        return 1
    tainted = sorted({f"{s.upper()} round {i + 1}" for s in "ab" for i, d in enumerate(docs[s])
                      if any(r.get("tainted") for r in d.get("results", []))})
    title = (f"perfgate ab: {hardware_id}, {args.rounds} rounds, B vs A (baseline = A), "
             f"threshold {args.threshold * 100:g}%")
    for line in metric_table(results, width=stdout_width(), title=title):
        print(line.text)
    for r in results:
        print(f"  {r.test_id.split('::', 1)[-1]} {r.metric}: {r.verdict['outcome']}: {r.verdict['explanation']}")
    if tainted:
        print(f"  note: the machine was busy (before the session or while measuring) in these runs, "
              f"their metrics tainted: {', '.join(tainted)}")
    regressions = [r for r in results if r.outcome == "regression"]
    if args.save:
        doc = results_mod.make_document(results, hardware_id=hardware_id,
                                        fingerprint=docs["b"][-1].get("fingerprint") or {},
                                        commit=docs["b"][-1].get("commit"))
        doc["ab"] = {"a": {"python": sides["a"][0], "env": sides["a"][1]},
                     "b": {"python": sides["b"][0], "env": sides["b"][1]},
                     "rounds": args.rounds, "order": ["".join(p) for p in order], "threshold": args.threshold,
                     "confidence": args.confidence,
                     "pytest_args": pytest_args, "tainted_runs": tainted,
                     "a_fingerprint": docs["a"][-1].get("fingerprint")}
        results_mod.save(args.save, doc)
        print(f"saved {args.save}")
    if regressions:
        print(f"{len(regressions)} performance regression(s) of B against A:")
        for r in regressions:
            print(f"  {regression_line(r, (docs['b'][-1].get('fingerprint') or {}).get('software'))}")
        return 1
    return 0
