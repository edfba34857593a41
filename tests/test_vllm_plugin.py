"""perfgate's vLLM plugin (perfgate.workloads.serving.vllm_plugin): how serving_decode_slowdown
reaches a real server's decode step, and that it is inert otherwise."""
from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest

from perfgate import mutations
from perfgate.workloads.serving import vllm_plugin


def test_vllm_finds_the_plugin_through_its_entry_point():
    """vLLM loads every ``vllm.general_plugins`` entry point in each of its processes: that is the
    only way the knob gets into a server perfgate does not control."""
    try:
        metadata.distribution("perfgate")
    except metadata.PackageNotFoundError:
        pytest.skip("perfgate is not installed as a distribution here (pip install -e . registers the entry point)")
    found = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert found.get("perfgate_mutations") == "perfgate.workloads.serving.vllm_plugin:register", found


def test_the_plugin_does_nothing_in_a_normal_run(monkeypatch):
    monkeypatch.delenv(mutations.ENV, raising=False)
    assert vllm_plugin.register() is None


def test_a_server_without_cuda_refuses_the_knob(monkeypatch):
    """Off-GPU the knob could only do nothing while the results say 'mutated': the server must not start."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the knob would patch the worker")
    monkeypatch.setenv(mutations.ENV, "serving_decode_slowdown:0.1")
    with pytest.raises(RuntimeError, match="serving_decode_slowdown needs a CUDA GPU"):
        vllm_plugin.register()


def test_only_decode_steps_count_toward_the_calibration():
    """Empty steps and prefill-sized steps go straight through, uncounted (harness logic: a stand-in
    for vLLM's worker and scheduler output; the burn itself needs a GPU)."""
    calls = []
    burn = vllm_plugin._DecodeBurn(0.1)

    def original(worker, so):
        calls.append(so.total_num_scheduled_tokens)
        return "out"

    for tokens in (0, vllm_plugin.DECODE_TOKENS + 1, 2048):
        assert burn.step(original, object(), SimpleNamespace(total_num_scheduled_tokens=tokens)) == "out"
    assert calls == [0, vllm_plugin.DECODE_TOKENS + 1, 2048]
    assert burn.seen == 0 and burn.spans_ms == [] and burn.burn is None
    for _ in range(vllm_plugin.SKIP_STEPS):  # warm-up decode steps: counted, not timed
        burn.step(original, object(), SimpleNamespace(total_num_scheduled_tokens=1))
    assert burn.seen == vllm_plugin.SKIP_STEPS and burn.spans_ms == []
