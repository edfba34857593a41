"""The /metrics readers the serving trade-off tests use (preemptions, the engine's TPOT), against a
real HTTP server on the loopback that serves a page in vLLM 0.32's format."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from perfgate.workloads.serving.prometheus_counters import EngineCounters, PrefixCacheCounters, StepCounters, preemptions

PAGE = {"text": ""}

BEFORE = """# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="perfgate-model"} 3.0
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.01",model_name="perfgate-model"} 10.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="perfgate-model"} 0.12
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="perfgate-model"} 12.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="perfgate-model"} 12.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="perfgate-model"} 0.24
vllm:request_prefill_time_seconds_count{engine="0",model_name="perfgate-model"} 12.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="perfgate-model"} 0.0
vllm:request_queue_time_seconds_count{engine="0",model_name="perfgate-model"} 12.0
"""
AFTER = (BEFORE.replace("} 3.0", "} 7.0").replace("} 0.12", "} 0.18").replace("} 12.0", "} 18.0")
         .replace("} 0.24", "} 0.33").replace("} 0.0\n", "} 0.006\n"))


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = PAGE["text"].encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def base_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_preemptions_and_the_engines_clocks_over_a_phase(base_url):
    PAGE["text"] = BEFORE
    before_n, before = preemptions(base_url), EngineCounters.read(base_url)
    PAGE["text"] = AFTER
    assert preemptions(base_url) - before_n == 4
    times = EngineCounters.read(base_url).since(before)  # 6 requests finished in the phase
    assert times.requests == 6
    assert times.tpot_ms == pytest.approx(10.0)      # 0.06 s / 6
    assert times.prefill_ms == pytest.approx(15.0)   # 0.09 s / 6
    assert times.queue_ms == pytest.approx(1.0)      # 0.006 s / 6
    assert before.since(before) is None  # no request finished: no figure


def test_a_server_without_the_counters_names_them(base_url):
    PAGE["text"] = "vllm:generation_tokens_total 5\n"
    with pytest.raises(KeyError, match="vllm:num_preemptions"):
        preemptions(base_url)
    with pytest.raises(KeyError, match="vllm:request_prefill_time_seconds_count"):
        EngineCounters.read(base_url)


def test_every_reader_takes_the_older_counter_names_and_names_both_counters_it_lacks(base_url):
    """One reader behind all four (read_counters): a name without ``_total`` (older vLLM) is read
    alike, and a page with one of two counters fails naming both."""
    PAGE["text"] = ("vllm:prefix_cache_queries 40\nvllm:prefix_cache_hits 30\nvllm:num_preemptions 2\n"
                    "vllm:generation_tokens_total 64\nvllm:iteration_tokens_total_count 16\n")
    assert PrefixCacheCounters.read(base_url) == PrefixCacheCounters(queries=40.0, hits=30.0)
    assert preemptions(base_url) == 2.0
    assert StepCounters.read(base_url).tokens_per_step_since(StepCounters(0.0, 0.0)) == 4.0
    PAGE["text"] = "vllm:prefix_cache_queries_total 40\n"
    with pytest.raises(KeyError, match="prefix_cache_queries_total / vllm:prefix_cache_hits_total counter"):
        PrefixCacheCounters.read(base_url)


def test_a_runs_engine_clocks_wait_for_its_last_requests_and_give_up_on_a_server_without_them(base_url, monkeypatch):
    """loadgen reads the histograms until they count the run's completed requests (vLLM observes a
    request as it hands out its last output, so a scrape right after the client's last token can
    miss it), at most ENGINE_SETTLE_S; a page without them, or a server gone, gives no figure."""
    import threading as _threading

    from perfgate.workloads.serving import loadgen

    PAGE["text"] = BEFORE
    before = loadgen._engine_counters(base_url)
    late = _threading.Timer(0.3, lambda: PAGE.update(text=AFTER))  # the last 6 requests counted 0.3 s late
    late.start()
    times = loadgen._engine_times(base_url, before, completed=6)
    late.join()
    assert times is not None and times.requests == 6 and times.prefill_ms == pytest.approx(15.0)
    # fewer counted than completed after the settle time: the figure of what was counted, not a hang
    monkeypatch.setattr(loadgen, "ENGINE_SETTLE_S", 0.2)
    assert loadgen._engine_times(base_url, before, completed=60).requests == 6
    PAGE["text"] = "vllm:generation_tokens_total 5\n"
    assert loadgen._engine_counters(base_url) is None
    assert loadgen._engine_times(base_url, None, completed=6) is None
    assert loadgen._engine_counters("http://127.0.0.1:9") is None  # nothing listens on the discard port
