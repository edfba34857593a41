"""`perfgate serve start|status|url|stop`: vLLM servers started once, for several pytest runs to attach to.

Why: each pytest run of the serving suite starts its own server (70-200 s to /health), so where a
job's time limit is shorter than a server start plus the suite, or where several selections (a
`perfgate ab`, a `perfgate power` table) should measure one server, start it once, attach each run to
it (``PERFGATE_SERVING_URL``, perfgate/workloads/serving/attached.py) and stop it at the end:

    perfgate serve start                         # the profile's default dense server; prints how to attach
    PERFGATE_SERVING_URL=$(perfgate serve url) pytest -m "cpu and vllm" -k single_stream_decode perf/serving
    PERFGATE_SERVING_URL=$(perfgate serve url) pytest -m "cpu and vllm" -k concurrency_sweep perf/serving
    perfgate serve stop                          # every server started from the folder, by PID

- ``start [K=V...]``: the server the suite would start for the profile present (``--profile``, default gpu
  where a GPU is visible, else cpu), bound to 127.0.0.1, in a session of its own so it outlives the command
  and its job. K=V pairs go into the server's environment (a planted test-only knob acts where the server
  runs). It returns once /health answers (exit 0, the URL in DIR/NAME.url) or the start failed (exit 1,
  the reason and the log's tail). A `start` of a NAME already up returns it when asked the same and is
  refused otherwise (exit 1: stop it first); one still starting (its job ended mid-start) is waited for.
- ``status``: each server of the folder: up, starting, died, stale; PID, port, model (``--json``).
- ``url [NAME]``: NAME's URL (default dense), for ``PERFGATE_SERVING_URL=$(perfgate serve url)``; exit 1
  where it is not up.
- ``stop [NAME...]``: ends the servers (all, or those named) by their recorded PIDs only, and removes
  their state; exit 0 with a message when none is running.

``--dir`` names the folder of the servers' state (default $PERFGATE_SERVE_DIR, else perfgate-serve-UID in
this machine's temporary folder): see perfgate/workloads/serving/detached.py for its files.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from perfgate.options import number
from perfgate.workloads.serving import detached
from perfgate.workloads.serving.detached import DEFAULT_GPU_MEMORY, DIR_ENV, ServeError, Server
from perfgate.workloads.serving.profiles import PROFILES

PROGRESS_EVERY_S = 15.0


def _add_dir(p) -> None:
    p.add_argument("--dir", metavar="DIR",
                   help=f"the folder of the servers' state (default: ${DIR_ENV}, else perfgate-serve-UID in this "
                        f"machine's temporary folder)")


def register(sub) -> None:
    p = sub.add_parser("serve", help="start vLLM servers once for several pytest runs to attach to; status; stop",
                       description="Start the serving suite's vLLM server once, attach several pytest runs to it "
                                   "(PERFGATE_SERVING_URL), stop it: for a job's time limit shorter than a server "
                                   "start plus the suite, or an A/B of servers started once (docs/serving.md).")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser(
        "start", help="start the serving suite's default dense server on 127.0.0.1, detached; print how to attach")
    start.add_argument("env", nargs="*", metavar="K=V",
                       help="variables for the server's environment, e.g. PERFGATE_TEST_MUTATION=NAME:VALUE "
                            "(a planted serving knob acts where the server runs)")
    start.add_argument("--name", default="dense",
                       help="the server's name (default dense): several servers side by side, e.g. plain and "
                            "planted for an A/B")
    start.add_argument("--profile", choices=sorted(PROFILES),
                       help="the serving profile whose server to start (default: gpu where a GPU is visible, "
                            "else cpu)")
    start.add_argument("--gpu-memory-utilization", metavar="FRACTION",
                       type=number("the server's share of GPU memory", above=0, at_most=1),
                       help=f"the server's share of GPU memory, gpu profile only (default {DEFAULT_GPU_MEMORY:g}: "
                            f"two servers of the profile's 7.24 B model on one H200)")
    _add_dir(start)
    start.add_argument("--json", action="store_true", help="print the server as JSON (url, pid, port, model...)")
    start.set_defaults(func=run_start)
    status = actions.add_parser("status", help="the servers started from the folder: up or not, PID, port, model")
    _add_dir(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run_status)
    url = actions.add_parser("url", help="print a running server's URL (for PERFGATE_SERVING_URL=$(...))")
    url.add_argument("name", nargs="?", default="dense", metavar="NAME", help="the server (default dense)")
    _add_dir(url)
    url.set_defaults(func=run_url)
    stop = actions.add_parser("stop", help="end the servers started from the folder (by their recorded PIDs)")
    stop.add_argument("names", nargs="*", metavar="NAME", help="only these servers (default: all)")
    _add_dir(stop)
    stop.set_defaults(func=run_stop)


def _attach_hint(server: Server, info: dict) -> str:
    marks = "cpu and vllm" if info.get("profile") == "cpu" else "1gpu and vllm"
    url = server.url()
    return (f"Attach pytest runs to it (tests needing another server configuration skip, saying so):\n"
            f"    PERFGATE_SERVING_URL={url} pytest -m \"{marks}\" perf/serving\n"
            f"Its URL is also in {server.file('url')}. Stop it: perfgate serve stop {server.name}"
            f"{'' if server.root == detached.default_dir().resolve() else f' --dir {server.root}'}")


def _report_up(server: Server, as_json: bool, already: bool) -> int:
    info = server.info()
    if as_json:
        print(json.dumps({**server.describe(), "already_up": already}, indent=1))
        return 0
    how = "already up" if already else f"up after {info.get('startup_s', 0):.0f} s"
    print(f"{server.name}: {how} at {server.url()} ({info.get('profile')} profile, PID {info.get('server_pid')}, "
          f"model {info.get('model')}; log {info.get('log')})")
    print(_attach_hint(server, info))
    return 0


def run_start(args: argparse.Namespace) -> int:
    env = detached.parse_env(args.env)
    name = detached.check_name(args.name)
    profile = args.profile or detached.default_profile()
    memory = args.gpu_memory_utilization
    if profile == "gpu":
        memory = DEFAULT_GPU_MEMORY if memory is None else memory
    elif memory is not None:
        raise ServeError("--gpu-memory-utilization is for the gpu profile only")
    root = detached.state_dir(args.dir, create=True)
    server = Server(root, name)
    with detached.start_lock(server):  # two starts of one NAME at once must not both start a server
        begun = _begin(server, profile, memory, env, args.json)
    if isinstance(begun, int):
        return begun
    return _wait_for(server, begun, PROFILES[profile].startup_timeout_s + 60, args.json,
                     f"starting {name} ({profile} profile) in {root}; a start takes 70-200 s")


def _begin(server: Server, profile: str, memory: float | None, env: dict[str, str], as_json: bool):
    """An exit code where NAME is up already or cannot be started; else the holder to wait for (its Popen,
    or None for a start already under way)."""
    name, root = server.name, server.root
    asked = detached.asked_of(profile, memory, env)
    if server.other_host():
        raise ServeError(f"{name} in {root} was started on {server.other_host()}: give another --dir or --name")
    state = server.state()
    if state in ("up", "starting", "not answering"):
        was = server.read("args") or ""
        if was != asked:
            print(f"perfgate serve: {name} is {'already up at ' + str(server.url()) if state == 'up' else state}, "
                  f"started with {', '.join(was.splitlines()) or 'nothing recorded'}; `perfgate serve stop {name}` "
                  f"first to start it with {', '.join(asked.splitlines())}", file=sys.stderr)
            return 1
        if state == "up":
            return _report_up(server, as_json, already=True)
        if state == "not answering":
            print(f"perfgate serve: {name}'s server at {server.url()} does not answer /health; "
                  f"`perfgate serve stop {name}`, then start it again", file=sys.stderr)
            return 1
        return None
    if state != "absent":
        detached.stop(server)  # stale or died: end what is left of it by its recorded PIDs, forget it
    # the model first, here: a missing PERFGATE_SERVING_MODEL is said at once, and the holder stays small
    # (building the CPU model's weights imports torch: a holder that built it kept 471 MB RSS, one that did
    # not 42 MB, for the server's whole life)
    detached.dense_server(PROFILES[profile], root / "models")
    return detached.spawn(server, profile, memory, env, asked)


def _holder_ended(server: Server, holder) -> bool:
    """Our own holder (``holder``: its Popen) has exited; one started by an earlier `start` is gone."""
    return holder.poll() is not None if holder is not None else server.holder() is None


def _wait_for(server: Server, holder, timeout_s: float, as_json: bool, starting: str) -> int:
    """Until NAME.url (up) or NAME.error (failed) appears, or the holder is gone. A start that runs past
    ``timeout_s`` or is called off with Ctrl-C is stopped, so no half-started server is left behind; one
    whose command gets SIGTERM (a job's time limit) goes on, for the next `start` to wait for."""
    t0 = time.monotonic()
    next_progress = t0 + PROGRESS_EVERY_S
    try:
        print(f"perfgate serve: {starting if holder is not None else f'{server.name} is starting already: waiting'}",
              file=sys.stderr)
        while True:
            if server.url() is not None and server.state() == "up":
                return _report_up(server, as_json, already=False)
            error = server.read("error")
            if error is not None:
                print(f"perfgate serve: {server.name} did not start: {error.strip()}", file=sys.stderr)
                detached.stop(server)
                return 1
            if _holder_ended(server, holder) and server.read("error") is None:
                from perfgate.workloads.serving.server import log_tail

                said = log_tail(server.work_dir / "holder.log", 5).strip() or "(nothing)"
                print(f"perfgate serve: {server.name}'s holder ended before its server was up; "
                      f"{server.work_dir / 'holder.log'} ends:\n{said}", file=sys.stderr)
                detached.stop(server)
                return 1
            now = time.monotonic()
            if now - t0 > timeout_s:
                detached.stop(server)
                print(f"perfgate serve: {server.name}: no answer on /health after {timeout_s:.0f} s; stopped",
                      file=sys.stderr)
                return 1
            if now >= next_progress:
                from perfgate.workloads.serving.server import log_tail

                line = log_tail(server.work_dir / "vllm_server.log", 1).strip()
                print(f"perfgate serve: {server.name}: {now - t0:.0f} s, waiting for /health; log: {line[-100:]}",
                      file=sys.stderr)
                next_progress = now + PROGRESS_EVERY_S
            time.sleep(0.5)
    except KeyboardInterrupt as exc:
        if getattr(exc, "signum", signal.SIGINT) == signal.SIGTERM:
            # a job's time limit ending this command: the server is detached so as to outlive it
            print(f"perfgate serve: {server.name} is still starting; `perfgate serve start` with the same "
                  f"arguments waits for it, `perfgate serve stop {server.name}` ends it", file=sys.stderr)
            raise
        detached.stop(server)  # Ctrl-C: the user called the start off; it leaves nothing running
        if holder is not None and holder.poll() is None:
            holder.kill()  # it had not recorded its PID yet
        print(f"perfgate serve: {server.name}: start interrupted; stopped", file=sys.stderr)
        raise


def run_status(args: argparse.Namespace) -> int:
    root = detached.state_dir(args.dir, create=False)
    found = detached.servers_in(root) if root.exists() else []
    rows = [s.describe() for s in found]
    if args.json:
        print(json.dumps({"dir": str(root), "servers": rows}, indent=1))
        return 0
    if not rows:
        print(f"perfgate serve: no server started from {root}")
        return 0
    print(f"servers started from {root}:")
    for r in rows:
        where = f"{r['url']} (port {r['port']})" if r["url"] else "-"
        print(f"  {r['name']}: {r['state']}, PID {r['pid'] or '-'} (holder {r['holder_pid'] or '-'}), {where}, "
              f"model {r['model'] or '-'}")
        if r.get("error"):
            print(f"    {r['error'].splitlines()[0][:200]}")
    return 0


def run_url(args: argparse.Namespace) -> int:
    server = Server(detached.state_dir(args.dir, create=False), detached.check_name(args.name))
    state = server.state()
    if state != "up":
        print(f"perfgate serve: {server.name} is not up in {server.root} ({state}): `perfgate serve start"
              f"{'' if server.name == 'dense' else f' --name {server.name}'}` first", file=sys.stderr)
        return 1
    print(server.url())
    return 0


def run_stop(args: argparse.Namespace) -> int:
    root = detached.state_dir(args.dir, create=False)
    found = {s.name: s for s in (detached.servers_in(root) if root.exists() else [])}
    names = [detached.check_name(n) for n in args.names] or sorted(found)
    if not found or not names:
        print(f"perfgate serve: no server is running from {root}; nothing to stop")
        return 0
    for name in names:
        server = found.get(name)
        if server is None:
            print(f"perfgate serve: no server named {name} in {root}; nothing to stop")
            continue
        url = server.url()
        if detached.stop(server):
            print(f"perfgate serve: stopped {name}{f' ({url})' if url else ''}")
        else:
            print(f"perfgate serve: {name} was not running; its state is removed")
    return 0
