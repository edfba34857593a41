"""The process plumbing every perfgate launcher shares (launch, multinode, the correctness rank pool).

- :class:`ProcessJob`: the processes of one job, each started as the leader of its own
  session, and :meth:`ProcessJob.kill_all`, which leaves none of them or their children.
- :func:`start_in_own_session`: how a launcher starts such a process, output to a log file.
- :func:`resolve_target`: a rank's ``"package.module:function"`` to the function.
- :func:`write_pickle_atomic`: a result or a job file handed over atomically (readers see whole files only).
- :func:`tail` and :func:`signal_name`: what a failure message quotes.
- :func:`tree_pids`: a process and its descendants, by PID.

Nothing here imports torch: the parent of a job must not touch CUDA by accident.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

KILL_GRACE_S = 3.0
TAIL_LINES = 15


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log ('' when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def tree_pids(pid: int) -> set[int]:
    """``pid`` and every descendant of it that is alive now ({pid} when it cannot be read)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    return {pid}


def resolve_target(target: str) -> Any:
    """``"package.module:function"`` (or ``module:Class.method``) to the object it names."""
    module_name, _, attr = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def write_pickle_atomic(path: Path, obj: Any) -> None:
    """Pickle ``obj`` to ``path`` atomically: a reader sees the whole file or none."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh)
    os.replace(tmp, path)


def start_in_own_session(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new session (so ``killpg`` reaches its children), output to ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


JOB_TAG_ENV = "PERFGATE_JOB_TAG"


class ProcessJob:
    """The processes of one job (a launch's ranks, a `vllm serve`) and every process they started,
    so that all of them can be killed.

    Each process leads its own process group (``start_new_session``), and ``killpg`` reaches
    whatever stayed in it. A child that made its own session (a server, a daemonised
    helper) is not in the group; we find it two ways and kill it by identity (psutil checks
    the start time, so a reused PID is never hit): through psutil while its parent is alive
    (:meth:`scan`), and by the job's tag in its environment (:meth:`env`), which it inherits
    and keeps even when its parent died before any scan saw it (a server that crashed at
    start-up right after starting an engine).
    """

    _SCAN_EVERY_S = 1.0

    def __init__(self, procs: list[subprocess.Popen], grace_s: float = KILL_GRACE_S):
        self.procs = procs
        self.grace_s = grace_s
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex}"
        self._seen: dict[int, Any] = {}
        self._next_scan = 0.0

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` plus this job's tag: give it to every process the job starts."""
        return {**env, JOB_TAG_ENV: self.tag}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def scan(self, force: bool = False) -> None:
        """Remember the ranks' current descendants (cheap; done about once a second)."""
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + self._SCAN_EVERY_S
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency
            return
        for p in self.procs:
            if p.poll() is not None:
                continue
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(p.pid).children(recursive=True):
                    self._seen.setdefault(child.pid, child)

    def _signal_groups(self, sig: int) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)

    def _tagged(self) -> list[Any]:
        """Live processes (not this one) whose environment carries this job's tag."""
        import psutil

        found = []
        for p in psutil.process_iter(["environ"]):
            if p.pid != os.getpid() and (p.info.get("environ") or {}).get(JOB_TAG_ENV) == self.tag:
                found.append(p)
        return found

    def _escaped(self) -> list[Any]:
        import psutil

        alive = {}
        for child in [*self._seen.values(), *self._tagged()]:
            with contextlib.suppress(psutil.Error):
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    alive.setdefault(child.pid, child)
        return list(alive.values())

    def kill_all(self) -> None:
        """SIGTERM every rank's process group and escaped child, then SIGKILL what is left."""
        self.scan(force=True)
        self._signal_groups(signal.SIGTERM)
        self._signal_groups(signal.SIGCONT)  # a stopped (SIGSTOPped) rank acts on SIGTERM only once continued
        for child in self._escaped():
            with contextlib.suppress(Exception):
                child.terminate()
        deadline = time.monotonic() + self.grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The group may still hold grandchildren even when the leader is gone.
        self._signal_groups(signal.SIGKILL)
        escaped = self._escaped()
        for child in escaped:
            with contextlib.suppress(Exception):
                child.kill()
        if escaped:
            import psutil

            psutil.wait_procs(escaped, timeout=KILL_GRACE_S)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=KILL_GRACE_S)
        # SIGKILL is asynchronous: return only once the groups are empty, so that "launch
        # returned" means "nothing of the job runs any more".
        deadline = time.monotonic() + KILL_GRACE_S
        while any(process_group_alive(p.pid) for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.02)


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (signal 0 delivers nothing)."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_process_groups(pgids: list[int]) -> None:
    """SIGKILL whole process groups by their leaders' pids (for processes this caller did not start)."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
