"""The results document of one run: every recorded metric with its verdict, as JSON.

This is the hand-over format between a run and everything after it: `--perf-save`
writes it, `perfgate refresh` turns it into baselines, `perfgate compare` diffs two of
them, `perfgate report` plots a history of them.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from perfgate.judge.metric_result import MetricResult
from perfgate.store.atomic import write_json_atomic
from perfgate.store.baselines import now_iso
from perfgate.store.readers import Checker, ReadError, read_json
from perfgate.store.shapes import check_results_document, check_schema

SCHEMA_VERSION = 1
KIND = "perfgate-results"


class ResultsError(ReadError):
    """A results file is unreadable; the message names the file."""


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD, + "-dirty-<hash>" when tracked files differ from it (the hash of `git diff HEAD`, so two
    dirty trees measured from one commit are told apart), or PERFGATE_GIT_COMMIT where the tree was
    copied without .git (GPU runners)."""
    if os.environ.get("PERFGATE_GIT_COMMIT"):
        return os.environ["PERFGATE_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    if not dirty:
        return out.stdout.strip()
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=cwd, capture_output=True, timeout=30).stdout
    return f"{out.stdout.strip()}-dirty-{hashlib.sha256(diff).hexdigest()[:10]}"


def make_document(results: list[MetricResult], *, hardware_id: str, fingerprint: dict, commit: str | None,
                  attachments: dict[str, dict[str, Any]] | None = None, interrupted: bool = False,
                  skipped_by_budget: list[str] | None = None) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": now_iso(), "hardware_id": hardware_id,
            "commit": commit, "fingerprint": fingerprint, "interrupted": interrupted,
            "skipped_by_budget": skipped_by_budget or [],
            "results": [r.to_dict() for r in results], "attachments": attachments or {}}


def save(path: Path, document: dict) -> None:
    write_json_atomic(Path(path), document)


def load(path: Path) -> dict:
    """A results file, checked down to every entry a command reads (perfgate.store.readers)."""
    path = Path(path)
    fix = "results files are written by `pytest --perf-save PATH`: re-run with --perf-save"
    try:
        doc = read_json(path, fix="re-run with --perf-save", error=ResultsError)
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file; write one with `pytest --perf-save {path}`") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ResultsError(f"{path}: not a perfgate results file (kind != {KIND!r}); "
                           f"results files are written by `pytest --perf-save PATH`")
    check_schema(path, doc.get("schema_version"), (SCHEMA_VERSION,), what="results ",
                 fix="re-run the suite with this perfgate", error=ResultsError)
    check_results_document(Checker(path, fix=fix, error=ResultsError), doc)
    return doc


