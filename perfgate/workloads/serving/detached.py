"""`vllm serve` servers that outlive the command that starts them, for pytest runs to attach to.

Why: a server start costs 70-140 s (imports, compile, CUDA-graph capture), and the serving suite
starts its own in every pytest run. Where a job's time limit is shorter than a server start plus the
suite, or where several pytest selections (a `perfgate ab`, a `perfgate power` table) should measure
one server, the server is started once (`perfgate serve start`), each run attaches to it through
``PERFGATE_SERVING_URL`` (perfgate.workloads.serving.attached), and `perfgate serve stop` ends it.

Each server is the suite's own default dense server of a profile (the model the serving fixtures
serve and their flags, prefix caching on), bound to 127.0.0.1. It is held by a small Python process
(:func:`hold`) that leads a session of its own, so it outlives the command and the job that started
it; the holder starts the server through perfgate.workloads.serving.server (which tracks every process
of it), waits on it, and on SIGTERM stops the whole server before it exits.

What a later command reads is in one folder (``--dir``), per server NAME:

- ``NAME.pid``: the holder's PID, the one process `stop` signals (its command line is checked first,
  so a PID reused by another process is never signalled);
- ``NAME.args``: what it was started with (profile, memory share, K=V variables, the variables that
  change its flags), so a second `start` of a running NAME returns it only when asked the same;
- ``NAME.url``: ``http://127.0.0.1:PORT``, written once /health answers (what PERFGATE_SERVING_URL takes);
- ``NAME.json``: host, the holder's and the server's PIDs and start times, port, model, log, start-up s;
- ``NAME.error``: why a start failed, or that the server died;
- ``NAME/``: the server's work folder (its log, caches); ``models/``: the models built for it.

The host is recorded: a folder on a shared file system must not make one node signal PIDs of another.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from perfgate.workloads.serving.profiles import PROFILES, ServingProfile

DIR_ENV = "PERFGATE_SERVE_DIR"
HOLDER_MODULE = "perfgate.workloads.serving.detached"
# Variables read where the server starts that change what it serves: part of what a running server
# was asked, so a `start` with other values is refused rather than handed the old server
SERVER_VARIABLES = ("PERFGATE_SERVING_MODEL", "PERFGATE_SERVING_ENGINE_ARGS", "PERFGATE_VLLM_CMD",
                    "PERFGATE_TEST_MUTATION")
DEFAULT_GPU_MEMORY = 0.42  # two servers of the GPU profile's 7.24 B model on one H200 (a plain and a planted one)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
STOP_WAIT_S = 40.0  # the holder stops its server (vLLM's engine: seconds; SERVER_GRACE_S at most) and exits


class ServeError(ValueError):
    """A request `perfgate serve` cannot do; the message says why and what to do."""


def default_dir() -> Path:
    """$PERFGATE_SERVE_DIR, else a folder of this user's in this machine's temporary folder: local to the
    node (the PIDs are), and where a later job on the node finds it."""
    given = os.environ.get(DIR_ENV)
    return Path(given) if given else Path(tempfile.gettempdir()) / f"perfgate-serve-{os.getuid()}"


def state_dir(path: Path | str | None, create: bool) -> Path:
    """The servers' folder, resolved; created (private to this user) where ``create``. One that another
    user owns is refused: its files would choose which PIDs we signal."""
    root = Path(path).expanduser().resolve() if path else default_dir().resolve()
    if create:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.exists():
        if not root.is_dir():
            raise ServeError(f"{root}: not a folder; give --dir a folder for the servers' state")
        if root.stat().st_uid != os.getuid():
            raise ServeError(f"{root} belongs to another user; give --dir a folder of your own")
    return root


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ServeError(f"server name {name!r}: use letters, digits, '_', '.', '-' (at most 64, no leading "
                         f"'.' or '-'): it names the server's files")
    return name


def parse_env(pairs: list[str]) -> dict[str, str]:
    """K=V pairs (the server's environment: a planted test-only knob acts where the server runs)."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ServeError(f"{pair!r}: expected KEY=VALUE (a variable for the server's environment)")
        env[key] = value
    return env


def default_profile() -> str:
    """The profile the serving suite runs here: gpu where a GPU is visible, else cpu."""
    from perfgate.machine import hardware

    return "gpu" if hardware.gpu_count() > 0 else "cpu"


# --- what the suite would serve ------------------------------------------------------------------------

def server_flags(profile: ServingProfile, *extra: str) -> tuple[str, ...]:
    """The profile's `vllm serve` flags, then ``extra``, then PERFGATE_SERVING_ENGINE_ARGS (GPU profile):
    one definition for the suite's servers (fixtures.serving) and the ones started here."""
    user = tuple(shlex.split(os.environ.get("PERFGATE_SERVING_ENGINE_ARGS", ""))) if profile.name == "gpu" else ()
    return (*profile.engine_args, *extra, *user)


def user_model_dir(var: str) -> Path | None:
    """The model folder $var names, checked (ServeError says what is missing), or None where it is unset."""
    user = os.environ.get(var)
    if not user:
        return None
    path = Path(user).expanduser().resolve()
    if not (path / "config.json").exists():
        raise ServeError(f"{var}={user}: no config.json there; point it at a Hugging Face model dir")
    if not (path / "tokenizer.json").exists():
        raise ServeError(f"{var}={user}: no tokenizer.json (a fast tokenizer is needed to pick prompt token ids)")
    return path


def built_model(root: Path, spec) -> tuple[Path, tuple[str, ...]]:
    """A model of ``spec`` under ``root`` and the flags its weights need. Built once, in a folder of its
    own renamed into place: a second server finds it, and a running server's files are never rewritten."""
    import shutil

    from perfgate.workloads.serving.tiny_model import build_tiny_model

    marker = root / "perfgate_tiny_model.json"
    if not (marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(asdict(spec)))):
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        build_tiny_model(staging, spec)
        if root.exists():  # a build cut short, or another spec's: set aside (a server may still read it)
            root.rename(Path(tempfile.mkdtemp(prefix=f".{root.name}-old-", dir=root.parent)) / root.name)
        try:
            staging.rename(root)
        except OSError:  # another server's start built it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    return root, (("--load-format", "dummy") if spec.weights == "dummy" else ())


def dense_server(profile: ServingProfile, models: Path) -> tuple[Path, tuple[str, ...]]:
    """(model folder, `vllm serve` flags) of the profile's default dense server, as the serving fixtures
    start it: the CPU profile always serves its tiny model built here, the GPU profile
    PERFGATE_SERVING_MODEL or its layout built here; prefix caching on."""
    user = user_model_dir("PERFGATE_SERVING_MODEL") if profile.name == "gpu" else None
    if user is not None:
        path, weights = user, ()
    else:
        spec = profile.dense_model
        path, weights = built_model(models / f"{profile.name}-dense-{spec.arch}-{spec.hidden_size}h{spec.num_layers}l",
                                    spec)
    return path, (*weights, *server_flags(profile, "--enable-prefix-caching"))


# --- the state of one server ---------------------------------------------------------------------------

@dataclass
class Server:
    """One NAME in the folder, as its files and its processes say."""

    root: Path
    name: str

    def file(self, ext: str) -> Path:
        return self.root / f"{self.name}.{ext}"

    @property
    def work_dir(self) -> Path:
        return self.root / self.name

    def read(self, ext: str) -> str | None:
        try:
            return self.file(ext).read_text()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def info(self) -> dict:
        try:
            return json.loads(self.read("json") or "{}")
        except json.JSONDecodeError:
            return {}

    def holder_pid(self) -> int | None:
        text = (self.read("pid") or "").strip()
        return int(text) if text.isdigit() else None

    def other_host(self) -> str | None:
        """The host it was started on, where that is not this one (then nothing here may signal it)."""
        host = self.info().get("host")
        return host if host and host != socket.gethostname() else None

    def holder(self):
        """The holder's psutil.Process, where its PID still runs this NAME's holder (not a reused PID)."""
        import psutil

        pid = self.holder_pid()
        if pid is None or self.other_host():
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            argv = proc.cmdline()
        except psutil.Error:
            return None
        if HOLDER_MODULE in argv and str(self.root) in argv and self.name in argv:
            return proc
        return None

    def url(self) -> str | None:
        text = (self.read("url") or "").strip()
        return text or None

    def state(self) -> str:
        """up, starting, not answering, died (a start failed or the server ended), stale (its holder is
        gone), elsewhere (started on another host), or absent (no state at all)."""
        from perfgate.workloads.serving.server import health_ok

        if not any(self.file(ext).exists() for ext in ("pid", "url", "json", "error", "args")):
            return "absent"
        if self.other_host():
            return "elsewhere"
        alive = self.holder() is not None
        if self.read("error") is not None:
            return "died"
        if not alive:
            return "stale"
        url = self.url()
        if url is None:
            return "starting"
        return "up" if health_ok(f"{url}/health") else "not answering"

    def describe(self) -> dict:
        info = self.info()
        error = (self.read("error") or "").strip()
        return {"name": self.name, "state": self.state(), "url": self.url(), "port": info.get("port"),
                "pid": info.get("server_pid"), "holder_pid": self.holder_pid(), "model": info.get("model"),
                "profile": info.get("profile"), "host": info.get("host"), "log": info.get("log"),
                "startup_s": info.get("startup_s"), "started_at": info.get("started_at"),
                **({"error": error} if error else {})}

    def forget(self) -> None:
        """Remove its state files (its work folder, with the log, stays for a look)."""
        for ext in ("pid", "args", "url", "json", "error"):
            self.file(ext).unlink(missing_ok=True)


def servers_in(root: Path) -> list[Server]:
    """Every NAME with a state file in the folder, by name."""
    names = {p.name.rsplit(".", 1)[0] for ext in ("pid", "url", "json", "error") for p in root.glob(f"*.{ext}")}
    return [Server(root, n) for n in sorted(names) if NAME.fullmatch(n)]


def asked_of(profile: str, memory: float | None, env: dict[str, str]) -> str:
    """What a server is started with, as NAME.args records it."""
    lines = [f"--profile {profile}"]
    if memory is not None:
        lines.append(f"--gpu-memory-utilization {memory:g}")
    lines += [f"{k}={v}" for k, v in sorted(env.items())]
    lines += [f"(environment) {k}={os.environ[k]}" for k in SERVER_VARIABLES if os.environ.get(k) and k not in env]
    return "".join(f"{line}\n" for line in lines)


# --- start, stop --------------------------------------------------------------------------------------

@contextlib.contextmanager
def start_lock(server: Server):
    """Held while a `start` decides whether NAME runs and starts it (an flock: released if the command dies)."""
    import fcntl

    server.work_dir.mkdir(parents=True, exist_ok=True)
    with open(server.work_dir / "start.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def spawn(server: Server, profile: str, memory: float | None, env: dict[str, str], asked: str) -> subprocess.Popen:
    """Start NAME's holder in a session of its own (it outlives this command and its job)."""
    server.work_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", HOLDER_MODULE, str(server.root), server.name, *(f"{k}={v}" for k, v in env.items()),
            "--profile", profile, *(["--gpu-memory-utilization", f"{memory:g}"] if memory is not None else [])]
    with open(server.work_dir / "holder.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    server.file("pid").write_text(f"{proc.pid}\n")
    server.file("args").write_text(asked)
    return proc


def stop(server: Server, wait_s: float = STOP_WAIT_S) -> bool:
    """End NAME's server by its recorded PIDs only, then remove its state. True where something was running.

    SIGTERM to the holder (it stops the server's whole process tree, then exits); where the holder does
    not exit in ``wait_s`` or is gone while its server is not, the server's process group and every
    process with its job tag in its environment (perfgate.launch.core.ProcessJob) are killed, the
    leader checked by its start time first, so no PID reused since is hit."""
    import psutil

    if server.other_host():
        raise ServeError(f"{server.name} was started on {server.other_host()}, not here ({socket.gethostname()}): "
                         f"stop it there")
    ran = False
    holder = server.holder()
    if holder is not None:
        ran = True
        with contextlib.suppress(psutil.Error):
            holder.send_signal(signal.SIGTERM)
        if not _gone(holder, wait_s):
            with contextlib.suppress(psutil.Error):
                holder.kill()
            _gone(holder, 5.0)
    ran = _end_server_processes(server.info()) or ran
    server.forget()
    return ran


def _gone(proc, wait_s: float) -> bool:
    import psutil

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False
        time.sleep(0.1)
    return not proc.is_running()


def _end_server_processes(info: dict) -> bool:
    """Kill what is left of the server: its leader's group (the leader checked by start time) and the
    processes whose environment carries its job tag. True where any was found."""
    import psutil

    from perfgate.launch.core import JOB_TAG_ENV

    left = []
    pid, started = info.get("server_pid"), info.get("server_start_time")
    if pid and started:
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(pid)
            if abs(leader.create_time() - started) < 0.01 and leader.status() != psutil.STATUS_ZOMBIE:
                left.append(leader)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
    tag = info.get("job_tag")
    if tag:
        for proc in psutil.process_iter(["environ"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and (proc.info.get("environ") or {}).get(JOB_TAG_ENV) == tag:
                    left.append(proc)
                    proc.kill()
    for proc in left:
        _gone(proc, 5.0)
    return bool(left)


# --- the holder ---------------------------------------------------------------------------------------

class _Stop(BaseException):
    """SIGTERM reached the holder: stop the server (start_server stops a server still starting)."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough; a second must not cut the stop short
    raise _Stop()


def _write(path: Path, text: str) -> None:
    """Write whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def hold(root: Path, name: str, profile: ServingProfile, memory: float | None, env: dict[str, str]) -> int:
    """The holder: start the server, publish it (NAME.json, then NAME.url), hold it until SIGTERM or its
    death, and stop it. Run as ``python -m perfgate.workloads.serving.detached`` by :func:`spawn`."""
    import psutil

    from perfgate.workloads.serving.server import ServerSpec, start_server

    signal.signal(signal.SIGTERM, _on_sigterm)
    os.environ.update(env)  # a planted knob that changes the server's flags acts here too (server.start_server)
    me = Server(root, name)
    info = {"name": name, "host": socket.gethostname(), "holder_pid": os.getpid(), "profile": profile.name}
    _write(me.file("json"), json.dumps(info, indent=1))
    server = None
    try:
        model, flags = dense_server(profile, root / "models")
        memory_args = ("--gpu-memory-utilization", f"{memory:g}") if memory is not None else ()
        spec = ServerSpec(model=str(model), work_dir=me.work_dir, env=tuple(env.items()),
                          startup_timeout_s=profile.startup_timeout_s, engine_args=(*flags, *memory_args),
                          shared_cache=root / "shared-cache")
        server = start_server(spec, progress=lambda t, line: print(f"{t:.0f} s: {line[-200:]}", flush=True))
        info.update(url=server.base_url, port=server.port, model=str(model), server_pid=server.proc.pid,
                    server_start_time=psutil.Process(server.proc.pid).create_time(), job_tag=server.job.tag,
                    log=str(server.log_path), startup_s=round(server.startup_s, 1),
                    started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), argv=server.argv)
        _write(me.file("json"), json.dumps(info, indent=1))
        _write(me.file("url"), server.base_url + "\n")
        while server.alive():
            server.job.scan()
            time.sleep(1.0)
        _write(me.file("error"), f"the server died: {server.failure_log(40)}\n")
        return 1
    except _Stop:
        return 0
    except Exception as exc:  # noqa: BLE001 (the start command shows whatever stopped the start)
        _write(me.file("error"), f"{type(exc).__name__}: {exc}\n")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {HOLDER_MODULE}",
                                 description="hold one server for `perfgate serve start` (not for direct use)")
    ap.add_argument("root", type=Path)
    ap.add_argument("name")
    ap.add_argument("env", nargs="*", metavar="K=V")
    ap.add_argument("--profile", choices=sorted(PROFILES), required=True)
    ap.add_argument("--gpu-memory-utilization", type=float)
    args = ap.parse_args(argv)
    return hold(args.root, args.name, PROFILES[args.profile], args.gpu_memory_utilization, parse_env(args.env))


if __name__ == "__main__":
    sys.exit(main())
