"""Predicted decode rate from measured miss latencies (perfgate/workloads/offload/decode_model.py).

Per round, the per-expert (t1) and per-layer (tk) cold-read latencies are measured for both read
strategies, interleaved, and fed to the decode model with the layer count and k of the file (the
seed's 40 layers and k = 8 for the fixture file) and the seed's measured hit rate, 0.70. The seed's
end-to-end result was 3.73 -> 5.52 tok/s (1.48x) from parallel segment reads on its SSD.
Reads and metrics: perfgate.workloads.offload.measurements (``decode_measure``, ``decode_reduce``).
"""
from __future__ import annotations

from fixtures.cases import profile_marks, record
from perfgate.workloads.offload import AREA

(CASE,) = AREA.all_cases("decode_prediction")


@profile_marks(AREA, "ssd")
def test_predicted_decode(perf, offload_io):
    record(perf, AREA.run(offload_io, CASE))
