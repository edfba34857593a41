"""The model file the offload suite reads, and the open readers shared by its tests.

Which file: `--perf-expert-file PATH` (fixtures/offload_option.py; setting PERFGATE_EXPERT_FILE
works too) points the suite at a user's real MoE GGUF model. Without it, one
real GGUF with the seed's expert layout is written per session (fixtures/gguf_experts.py; size
from PERFGATE_EXPERT_FILE_GIB, default 3 GiB, capped by free disk and RAM) in pytest's temp folder
(or PERFGATE_OFFLOAD_DIR) and deleted afterwards.

Every test reads with the page cache dropped; `cache_drop` checks once per session, with mincore,
that dropping really empties the file's pages here (it cannot on tmpfs: the suite skips, saying
so). Tests take `offload_io`, what the offload area measures with
(perfgate.workloads.offload.measurements.OffloadSource), and run `AREA.run(offload_io, case)`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fixtures.gguf_experts import choose_file_bytes, spec_for_bytes, write_expert_gguf
from fixtures.offload_option import expert_file_given
from perfgate.workloads.offload.expert_reads import ExpertReader
from perfgate.workloads.offload.gguf_layout import GGUFLayoutError, read_expert_layout
from perfgate.workloads.offload.device_probe import DeviceProbe
from perfgate.workloads.offload.page_cache import (drop_file_cache, page_cache_droppable,
                                                   resident_fraction)


@pytest.fixture(scope="session")
def expert_file(tmp_path_factory, pytestconfig) -> dict:
    """{"path", "source": "user"|"fixture", "bytes", "write_s"} of the GGUF file under test."""
    path = expert_file_given(pytestconfig)
    if path is not None:
        ok, why = page_cache_droppable(path)
        if not ok:
            pytest.skip(why)
        yield {"path": path, "source": "user", "bytes": path.stat().st_size, "write_s": None}
        return
    base = os.environ.get("PERFGATE_OFFLOAD_DIR")
    directory = Path(base) if base else tmp_path_factory.mktemp("offload")
    directory.mkdir(parents=True, exist_ok=True)
    ok, why = page_cache_droppable(directory)
    if not ok:
        pytest.skip(f"{why}; set PERFGATE_OFFLOAD_DIR to a folder on a local disk")
    path = directory / "perfgate-experts.gguf"
    info = write_expert_gguf(path, spec_for_bytes(choose_file_bytes(directory)))
    try:
        yield {"path": path, "source": "fixture", "bytes": info["bytes"], "write_s": info["write_s"]}
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def expert_layout(expert_file):
    try:
        return read_expert_layout(expert_file["path"])
    except GGUFLayoutError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def cache_drop(expert_file) -> dict:
    """Drop the whole file once and verify with mincore that (almost) nothing stays resident."""
    path = expert_file["path"]
    t0 = time.perf_counter()
    drop_file_cache(path)
    drop_s = time.perf_counter() - t0
    resident = resident_fraction(path)
    if resident > 0.01:
        pytest.fail(f"posix_fadvise(DONTNEED) left {resident:.1%} of {path} in the page cache: "
                    "reads would not reach the device", pytrace=False)
    return {"resident_after_drop": resident, "drop_s": drop_s}


@pytest.fixture(scope="session")
def expert_reader(expert_layout, cache_drop):
    with ExpertReader(expert_layout, direct=False, seed=1) as reader:
        yield reader


@pytest.fixture(scope="session")
def direct_expert_reader(expert_layout, cache_drop):
    from perfgate.workloads.offload.page_cache import direct_io_supported

    ok, why = direct_io_supported(expert_layout.path)
    if not ok:
        pytest.skip(why)
    with ExpertReader(expert_layout, direct=True, seed=2) as reader:
        yield reader


@pytest.fixture(scope="session")
def device_probe(expert_file, cache_drop):
    with DeviceProbe(expert_file["path"], direct=False, seed=3) as probe:
        yield probe


class OffloadIO:
    """The offload area's OffloadSource from this session's fixtures, each got when a measurement first
    asks (a test that reads no O_DIRECT never opens that reader; where O_DIRECT is refused, only the
    tests that need it skip)."""

    def __init__(self, request: pytest.FixtureRequest):
        self._request = request

    def _get(self, name: str):
        return self._request.getfixturevalue(name)

    @property
    def file(self) -> dict:
        return self._get("expert_file")

    @property
    def layout(self):
        return self._get("expert_layout")

    @property
    def cache_drop(self) -> dict:
        return self._get("cache_drop")

    @property
    def probe(self) -> DeviceProbe:
        return self._get("device_probe")

    def reader(self, io: str) -> ExpertReader:
        return self._get("expert_reader" if io == "buffered" else "direct_expert_reader")

    def need_direct_io(self, purpose: str) -> None:
        from perfgate.workloads.offload.page_cache import direct_io_supported

        ok, why = direct_io_supported(self.file["path"])
        if not ok:
            pytest.skip(f"{why}: {purpose}")


@pytest.fixture
def offload_io(request) -> OffloadIO:
    return OffloadIO(request)

