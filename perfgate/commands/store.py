"""`perfgate store add RESULTS...`: copy results files into the results store (perfgate.store.run_store).

The store is where the raw runs behind the baselines live, outside the code tree: ``--store DIR``
or PERFGATE_RESULTS_STORE. A file whose content is already stored, or whose name is taken by
other content, is refused (exit 1): a stored file is never replaced, since baselines name it by hash.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfgate.store import interrupts, run_store


def register(sub) -> None:
    p = sub.add_parser("store", help="the results store: raw results files outside the code tree")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="copy results files into the store as <hardware-id>/<name>.gz")
    add.add_argument("results", type=Path, nargs="+", help="results JSON written by `pytest --perf-save`")
    add.add_argument("--store", type=Path, help=f"the store's folder (default: ${run_store.ENV})")
    add.set_defaults(func=run_add)


def run_add(args: argparse.Namespace) -> int:
    root = run_store.root_of(args.store)
    refused = 0
    with interrupts.writing(f"results into the store {root}"):
        for path in args.results:
            try:
                ref = run_store.add(root, path)
            except run_store.StoreError as exc:
                print(f"perfgate store add: refused: {exc}", file=sys.stderr)
                refused += 1
                continue
            interrupts.say_while_writing(f"stored {path} as {root / ref['file']} (sha256 {ref['sha256']})")
    return 1 if refused else 0
