"""Does our read path measure the device, not the harness? Side by side with fio on the same file.

Same block (one gate segment), same queue depth (threads = fio psync jobs), O_DIRECT on both sides,
random block-aligned offsets with repeats allowed. Short runs of ours and fio alternate (order
flipped every pair) because this kind of device drifts by tens of percent within seconds; each
pair gives one ratio ours/fio, and their median should be within 10 % of 1 (reported) and must be
within 25 % (checked). Skipped where fio is not installed or the file's folder refuses O_DIRECT.
Reads and checks: perfgate.workloads.offload.measurements (``fio_measure``, ``fio_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.offload import AREA


@parametrize(AREA, "fio_crosscheck")
def test_fio_crosscheck(perf, offload_io, case):
    record(perf, AREA.run(offload_io, case))
