"""Start `vllm serve` servers that outlive this command, to attach tests to (PERFGATE_SERVING_URL), and stop them.

A lent GPU's call ends every process it started except one in a session of its own, and a server
start costs 80-130 s there; a serving A/B or power table attaches to servers started once (docs/serving.md):

    python3 scripts/attach_servers.py start /tmp/srv plain                # prints http://127.0.0.1:PORT
    python3 scripts/attach_servers.py start /tmp/srv planted PERFGATE_TEST_MUTATION=serving_decode_slowdown:0.05
    perfgate power --slowdowns 1.05 --env PERFGATE_SERVING_URL=$(cat /tmp/srv/plain.url) \\
        --b-env-at 1.05:PERFGATE_SERVING_URL=$(cat /tmp/srv/planted.url) -- -m "1gpu and vllm" -k gpu-dense perf/serving
    python3 scripts/attach_servers.py stop /tmp/srv                       # every server started there, by PID

Each server serves the profile's dense model (``--profile``, default gpu: PERFGATE_SERVING_MODEL, or the
profile's model built under DIR) with the profile's flags, prefix caching on, PERFGATE_SERVING_ENGINE_ARGS,
and ``--gpu-memory-utilization`` (default 0.42: two servers of the 7.24 B model on one H200). K=V pairs
are the server's environment (a planted knob acts where the server runs). ``start`` returns once /health
answers (exit 0, the URL on stdout and in DIR/NAME.url) or the start failed (exit 1, the reason and the
log's tail).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.serving import model_from_env, server_flags  # noqa: E402
from perfgate.workloads import serving  # noqa: E402
from perfgate.workloads.serving.server import ServerSpec, health_ok, start_server  # noqa: E402


def _serve(root: Path, name: str, env: dict[str, str], profile, memory: float) -> None:
    """The detached child: start the server, publish its URL, hold it until SIGTERM, then stop it.
    Model and flags as the suite's own server of the profile (fixtures.serving), then the memory share."""
    memory_args = ("--gpu-memory-utilization", f"{memory:g}") if profile.name == "gpu" else ()
    try:
        model = model_from_env("PERFGATE_SERVING_MODEL", root / "models", profile.dense_model)
        spec = ServerSpec(model=str(model.path), work_dir=root / name, env=tuple(env.items()),
                          startup_timeout_s=profile.startup_timeout_s,
                          engine_args=(*model.engine_args, *server_flags(profile, "--enable-prefix-caching"),
                                       *memory_args))
        server = start_server(spec)
    except Exception as exc:  # noqa: BLE001 (the parent shows whatever stopped the start)
        (root / f"{name}.error").write_text(f"{type(exc).__name__}: {exc}\n")
        return
    signal.signal(signal.SIGTERM, lambda *_: (server.stop(), os._exit(0)))
    (root / f"{name}.url").write_text(server.base_url + "\n")
    while server.alive():
        time.sleep(1.0)
    (root / f"{name}.error").write_text(f"the server died: {server.failure_log(40)}\n")


def start(args) -> int:
    root = Path(args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    env = {}
    for pair in args.env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            print(f"attach_servers: {pair!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        env[key] = value
    # what this server is started with: a start of a name already up returns it only when asked the same
    asked = "".join(f"{line}\n" for line in (f"--profile {args.profile}",
                                               f"--gpu-memory-utilization {args.gpu_memory_utilization:g}",
                                               *(f"{k}={v}" for k, v in sorted(env.items()))))
    url_file, args_file, pid_file, error_file = (root / f"{args.name}.{ext}" for ext in ("url", "args", "pid", "error"))
    running = url_file.read_text().strip() if pid_file.exists() and url_file.exists() else None
    if running and health_ok(f"{running}/health"):
        # one server per name: a second one would overwrite this one's PID file, and `stop` could not end it
        was = args_file.read_text() if args_file.exists() else ""
        if was != asked:
            print(f"attach_servers: {args.name} is already up at {running}, started with "
                  f"{', '.join(was.splitlines()) or 'nothing recorded'}; `stop {root}` first to start it with "
                  f"{', '.join(asked.splitlines())}", file=sys.stderr)
            return 1
        print(f"attach_servers: {args.name} is already up", file=sys.stderr)
        print(running)
        return 0
    for stale in (url_file, error_file, pid_file, args_file):
        stale.unlink(missing_ok=True)
    profile = serving.PROFILES[args.profile]
    pid = os.fork()
    if pid == 0:  # the child leads a session of its own: it outlives this command (and a device call)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            _serve(root, args.name, env, profile, args.gpu_memory_utilization)
        finally:
            os._exit(0)
    pid_file.write_text(f"{pid}\n")
    args_file.write_text(asked)
    deadline = time.monotonic() + profile.startup_timeout_s + 60
    while time.monotonic() < deadline:
        if url_file.exists():
            print(url_file.read_text().strip())
            return 0
        if error_file.exists():
            print(f"attach_servers: {args.name}: {error_file.read_text()}", file=sys.stderr)
            pid_file.unlink()  # it has ended: `stop` must not signal a PID reused since
            return 1
        time.sleep(1.0)
    os.kill(pid, signal.SIGTERM)
    pid_file.unlink()
    print(f"attach_servers: {args.name}: no URL after {profile.startup_timeout_s + 60:.0f} s; stopped", file=sys.stderr)
    return 1


def stop(args) -> int:
    root = Path(args.dir)
    stopped = 0
    for pid_file in sorted(root.glob("*.pid")):
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)  # the holder stops its server's whole process group
            stopped += 1
        except ProcessLookupError:
            pass
        pid_file.unlink()
        (root / f"{pid_file.stem}.url").unlink(missing_ok=True)
        (root / f"{pid_file.stem}.args").unlink(missing_ok=True)
    print(f"attach_servers: stopped {stopped} server(s) started in {root}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start")
    p.add_argument("dir")
    p.add_argument("name")
    p.add_argument("env", nargs="*", metavar="K=V")
    p.add_argument("--profile", choices=sorted(serving.PROFILES), default="gpu")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.42)
    p.set_defaults(func=start)
    s = sub.add_parser("stop")
    s.add_argument("dir")
    s.set_defaults(func=stop)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
