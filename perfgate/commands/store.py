"""`perfgate store add|copy|list|export`: the results store, where runs live outside the code tree.

``--store`` names it (perfgate.store.backends: a folder, an SQLite file, ``postgresql://...``), else
$PERFGATE_RESULTS_STORE, else the embedded default (an SQLite file in the user's data folder).

- ``add RESULTS...``: push results files. A run already stored (under any name) is not stored again (exit
  0, said so); a name taken by another run is refused (exit 1). ``--digest`` keeps only the run's digest
  (what a code tree keeps: perfgate.store.backends.documents). A store that cannot be reached is one line
  (exit 2); the results file stays where it was.
- ``copy SRC DST``: every run of SRC into DST, by hash, each read back from DST and compared byte for byte
  (``--digest``: their digests). Any two stores: folder, SQLite, PostgreSQL.
- ``list``: what a store holds, one line a run.
- ``export --hardware-id ID --test TEST --metric NAME``: one series as CSV (Otava, a spreadsheet).
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from perfgate.report.textable import printable
from perfgate.store import results as results_mod, run_store
from perfgate import interrupts
from perfgate.store.backends import ENV, StoreError, StoreUnavailable, describe, documents, open_store, spec_of


def add_store_option(p, *, what: str = "the results store") -> None:
    """``--store SPEC``, as every command that reads or writes runs takes it."""
    p.add_argument("--store", metavar="STORE",
                   help=f"{what}: a folder, an SQLite file (*.sqlite) or a postgresql:// URL (default: ${ENV}, "
                        f"else an SQLite file in the user's data folder)")


def register(sub) -> None:
    p = sub.add_parser("store", help="the results store: runs outside the code tree (folder, SQLite, PostgreSQL)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="push results files into the store, each once (by content hash)")
    add.add_argument("results", type=Path, nargs="+", help="results JSON written by `pytest --perf-save`")
    add.add_argument("--as", dest="name", metavar="NAME",
                     help="the run's name in the store (default: the file's own name; one file only)")
    add.add_argument("--digest", action="store_true",
                     help="keep only each run's digest (what a code tree keeps: summaries, no raw attachments)")
    add_store_option(add)
    add.set_defaults(func=run_add)
    copy = actions.add_parser("copy", help="copy every run of one store into another, lossless by hash")
    copy.add_argument("source", metavar="SRC", help="the store to read")
    copy.add_argument("destination", metavar="DST", help="the store to write (created if it does not exist)")
    copy.add_argument("--digest", action="store_true", help="write each run's digest instead of the run")
    copy.add_argument("--hardware-id", help="only the runs of this hardware id")
    copy.set_defaults(func=run_copy)
    show = actions.add_parser("list", help="the runs a store holds, oldest first")
    add_store_option(show)
    show.add_argument("--hardware-id", help="only the runs of this hardware id")
    show.set_defaults(func=run_list)
    export = actions.add_parser("export", help="one series (hardware id, test, metric) as CSV")
    add_store_option(export)
    export.add_argument("--hardware-id", required=True)
    export.add_argument("--test", required=True, help="the whole test id")
    export.add_argument("--metric", required=True)
    export.add_argument("--out", type=Path, help="write the CSV here (default: standard output)")
    export.set_defaults(func=run_export)


def run_add(args: argparse.Namespace) -> int:
    if args.name is not None and len(args.results) != 1:
        raise ValueError("--as names one run: give one results file with it")
    refused = 0
    with open_store(args.store, create=True) as store, \
            interrupts.writing(f"results into the {store.where}"):
        for path in args.results:
            try:
                doc = results_mod.load(path)
                raw = run_store.uncompressed_bytes(path)
                name = documents.stored_name(doc["hardware_id"], args.name or run_store.stored_name(path))
                if args.digest:
                    raw = documents.digest_of(doc, documents.sha256_of(raw))
                stored = store.put(raw, name)
            except (StoreError, results_mod.ResultsError) as exc:
                if isinstance(exc, StoreUnavailable):
                    raise  # one line for the whole command (exit 2): the store, not this file
                print(printable(f"perfgate store add: refused: {exc}"), file=sys.stderr)
                refused += 1
                continue
            what = "digest of " if stored.entry.digest else ""
            if stored.added:
                interrupts.say_while_writing(f"stored the {what}{path} as {stored.entry.name} in the {store.where} "
                                             f"(sha256 {stored.entry.sha256})")
            else:
                interrupts.say_while_writing(f"{path}: already stored as {stored.entry.name} (sha256 "
                                             f"{stored.entry.sha256}); not stored again")
    return 1 if refused else 0


def copy_store(source: str, destination: str, *, digest: bool = False, hardware_id: str | None = None,
               say=print) -> tuple[int, int]:
    """Every run of ``source`` into ``destination`` (``digest``: their digests), each read back and compared
    with what was sent. Returns (added, already there)."""
    added = present = 0
    with open_store(source) as src, open_store(destination, create=True) as dst:
        for entry in src.entries(hardware_id):
            raw = src.raw(entry.sha256)
            if digest and not entry.digest:
                raw = documents.digest_of(documents.parse(raw, f"{src.where}: {entry.name}"), entry.sha256)
            stored = dst.put(raw, entry.name)
            back = dst.raw(entry.sha256)
            if stored.entry.digest == (digest or entry.digest) and back != raw:
                raise StoreError(f"{dst.where}: {entry.name} reads back other bytes than {src.where} holds; "
                                 f"nothing after it was copied")
            added += stored.added
            present += not stored.added
    say(f"perfgate store copy: {added} run(s) copied, {present} already there "
        f"({describe(spec_of(source))} -> {describe(spec_of(destination))})")
    return added, present


def run_copy(args: argparse.Namespace) -> int:
    with interrupts.writing(f"runs into {describe(args.destination)}"):
        copy_store(args.source, args.destination, digest=args.digest, hardware_id=args.hardware_id,
                   say=interrupts.say_while_writing)
    return 0


def run_list(args: argparse.Namespace) -> int:
    with open_store(args.store) as store:
        entries = store.entries(args.hardware_id)
        print(f"{store.where}: {len(entries)} run(s)")
        for e in entries:
            print(printable(f"{e.sha256[:12]}  {e.created[:19]}  {(e.commit or '?')[:12]:12}  {e.name}"
                            + ("  (digest)" if e.digest else "")))
    return 0


CSV_COLUMNS = ("created", "commit", "median", "q1", "q3", "n", "unit", "tainted", "outcome", "sha256", "name")


def series_csv(rows) -> str:
    """A series as CSV: one line a run, oldest first (the columns Otava's CSV importer and a spreadsheet read)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([r.created, r.commit or "", repr(r.median), repr(r.q1), repr(r.q3), r.n, r.unit,
                         int(r.tainted), r.outcome, r.sha256, r.name])
    return out.getvalue()


def run_export(args: argparse.Namespace) -> int:
    with open_store(args.store) as store:
        rows = store.series(args.hardware_id, args.test, args.metric)
        if not rows:
            raise ValueError(printable(f"{store.where}: no series {args.hardware_id} / {args.test} / {args.metric}; "
                                       f"`perfgate store list` shows the runs"))
        text = series_csv(rows)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {len(rows)} run(s) to {args.out}")
    return 0
