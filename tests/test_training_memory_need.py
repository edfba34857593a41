"""A GPU training case states the memory it needs, and a GPU with less skips it with both numbers.

The estimate (perfgate.workloads.training.memory_need) is held against what was measured: every
committed 1xH200 training peak (torch's allocator peak and the MemTracker peak) must lie below the
estimate of its case, and the large cases' estimates within 25 % of their peaks, so a case neither
runs out of memory nor skips on a GPU where it fits.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perfgate.machine import hardware, markers
from perfgate.workloads.training import AREA, PROFILES
from perfgate.workloads.training.memory_need import need_gib

ROOT = Path(__file__).resolve().parents[1]


def _measured_peaks_gib(hardware_id: str) -> dict[str, float]:
    entries = json.loads((ROOT / "baselines" / hardware_id / "training.json").read_text())["entries"]
    out = {}
    for test_id, metrics in entries.items():
        peaks = [metrics[m]["summary"]["median"] / (1024 if m.endswith("_mib") else 1)
                 for m in ("peak_alloc_gib", "tracked_peak_mib") if m in metrics]
        if peaks:
            out[test_id.split("[", 1)[1].rstrip("]")] = max(peaks)
    return out


def test_every_gpu_training_case_states_its_memory_and_cpu_cases_do_not():
    for profile in PROFILES.values():
        for case in AREA.cases(profile):
            assert (case.device_memory_gib is not None) == profile.gpu, case.id


def test_the_estimate_covers_every_measured_1xh200_peak_and_stays_close_to_the_large_ones():
    needs = {c.id: c.device_memory_gib for p in PROFILES.values() if p.gpu for c in AREA.cases(p)}
    peaks = _measured_peaks_gib("1xH200")
    assert len(peaks) >= 20
    for case_id, peak in peaks.items():
        # the throughput ids carry the reduce dtype after the memory case's id
        need = needs.get(case_id) or needs[re.sub(r"-(fp32|bf16|fp16)reduce$", "", case_id) + "-fp32reduce"]
        assert need > peak, f"{case_id}: estimate {need} GiB, measured {peak:.2f} GiB"
        if peak >= 20:
            assert need <= 1.25 * peak, f"{case_id}: estimate {need} GiB is far above the measured {peak:.2f} GiB"


def test_the_largest_cases_fit_an_80_gb_h100_and_skip_on_a_48_gb_card():
    assert need_gib("gpt-1.3b-untied", 8, unsharded_copy=True) < 79.2  # an H100's usable memory (torch.cuda.mem_get_info)
    assert need_gib("gpt-1.3b", 8) > 44.5  # a 48 GB card


def test_a_gpu_smaller_than_the_need_skips_the_case_naming_both(monkeypatch):
    fp = {"gpus": [{"name": "NVIDIA L4", "memory_gib": 22.0}], "links": [["X"]], "cpu": {}, "software": {}}
    monkeypatch.setattr(hardware, "fingerprint", lambda: fp)
    monkeypatch.setattr(markers, "resolve_hardware_id", lambda: "1xL4")
    assert markers.missing_requirements({"1gpu", "gpu_memory"}, 28.4) == [
        "needs >= 28.4 GiB of GPU memory, this GPU has 22 GiB (1xL4)"]
    assert markers.missing_requirements({"1gpu", "gpu_memory"}, 4.0) == []
    assert markers.missing_requirements({"1gpu"}) == []


@pytest.mark.parametrize("mb", [0, -1])
def test_a_micro_batch_below_one_is_refused(mb):
    with pytest.raises(ValueError, match="micro_batch must be >= 1"):
        need_gib("gpt-110m", mb)
