"""``perfgate import seed``: the seed report's 8x V100 PCIe numbers as baselines, with provenance.

Every number comes from baselines-imported/seed-v100.json (beside baselines/), where it was
typed in with its section of the report; data, not code, so a reviewer checks numbers
against the report without reading Python. They are written to ``baselines/8xV100-PCIE-32GB-PCIe/<area>.json`` as
``imported`` entries (median = the reported number, n = runs the report averaged), so
the first run on such a machine is judged against the report. An imported number never
replaces a measured one unless --force: a measurement of the real machine is better
evidence than a report of another one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfgate.importers import Imported, ImportedNumber
from perfgate.judge.metrics import Summary
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.readers import Checker, read_json
from perfgate.judge.metric_result import area_of

TOOL = "seed"


DEFAULT_SEED = Path(__file__).resolve().parents[2] / "baselines-imported" / "seed-v100.json"
DEFAULT_PATHS = (DEFAULT_SEED,)


@dataclass(frozen=True)
class SeedNumber:
    """One number of the report, for one metric of one test."""

    test_id: str
    metric: str
    value: float
    unit: str
    better: str
    section: str   # "§4.4"
    n: int         # runs the report averaged
    what: str      # the report's own words for the cell, for the reviewer
    seed: str = field(default="", compare=False)        # "seed report 000 (8x V100 PCIe)"
    seed_short: str = field(default="", compare=False)  # "seed 000"

    @property
    def provenance(self) -> str:
        return f"imported: {self.seed}, {self.section}"

    @property
    def source(self) -> str:
        return f"{self.seed_short} {self.section}: {self.what}"


@dataclass(frozen=True)
class Seed:
    """A seed report's numbers and the machine it describes (the JSON file's content)."""

    name: str
    short_name: str
    seed_file: str                  # the report's text, relative to the folder above the project
    hardware_id: str
    when: str
    fingerprint: dict[str, Any]
    software_by_area: dict[str, dict[str, Any]]
    numbers: tuple[SeedNumber, ...]
    not_imported: tuple[tuple[str, str], ...] = ()
    pending_test_files: tuple[str, ...] = ()  # test files the numbers point at that do not exist yet


def load_seed(path: Path = DEFAULT_SEED) -> Seed:
    """Read a seed file; a missing or malformed one is a one-line error naming the file and the key."""
    fix = "restore it from git or pass another seed file: perfgate import seed PATH"
    try:  # the one reader: size cap, regular files only, no nesting bomb (perfgate.store.readers)
        doc = read_json(Path(path), fix=fix, error=ValueError)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such seed file; {fix}") from None
    c = Checker(Path(path), fix=fix, error=ValueError)  # each value finite, each n a whole count of runs
    try:
        name, short = doc["seed"], doc["seed_short"]
        numbers = tuple(SeedNumber(**{k: n[k] for k in ("test_id", "metric", "unit", "better", "section", "what")},
                                   value=c.number(n["value"], f"numbers[{i}].value"),
                                   n=c.integer(n["n"], f"numbers[{i}].n", minimum=1), seed=name, seed_short=short)
                        for i, n in enumerate(doc["numbers"]))
        return Seed(name=name, short_name=short, seed_file=doc["seed_file"], hardware_id=doc["hardware_id"],
                    when=doc["when"], fingerprint=doc["fingerprint"], software_by_area=doc["software_by_area"],
                    numbers=numbers, not_imported=tuple(tuple(x) for x in doc.get("not_imported", ())),
                    pending_test_files=tuple(doc.get("pending_test_files", ())))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed seed file (missing or wrong key {exc}); restore it from git") from None


def entry_for(n: SeedNumber, seed: Seed) -> BaselineEntry:
    """Median = the reported number; n = runs it averages; the number itself as the only sample."""
    v = n.value
    summary = Summary(median=v, mad=0.0, iqr=0.0, min=v, max=v, mean=v, n=n.n, samples=(v,))
    return BaselineEntry(unit=n.unit, better=n.better, summary=summary, tol=None, provenance=n.provenance,
                         when=seed.when, commit=None,
                         software=seed.software_by_area.get(area_of(n.test_id)), source=n.source)


def read(paths: list[Path], hardware_id: str | None) -> Imported:
    """The seed file's numbers; the file names its machine, so ``hardware_id`` must agree or be None."""
    if len(paths) != 1:
        raise ValueError(f"seed: one seed file at a time, got {len(paths)}")
    seed = load_seed(paths[0])
    if hardware_id is not None and hardware_id != seed.hardware_id:
        raise ValueError(f"{paths[0]}: the seed describes {seed.hardware_id}, not {hardware_id}; "
                         f"leave out --hardware-id")
    out = Imported(TOOL, hardware_id=seed.hardware_id, fingerprint=seed.fingerprint, when=seed.when)
    for n in seed.numbers:
        out.numbers.append(ImportedNumber(n.test_id, n.metric, n.unit, n.better, (n.value,), Path(paths[0]).name,
                                          n=n.n, provenance=n.provenance, source=n.source,
                                          software=seed.software_by_area.get(area_of(n.test_id))))
    out.left_out.extend((f"seed {section}", why) for section, why in seed.not_imported)
    return out
