"""A real, throw-away PostgreSQL server for perfgate's store tests (never a mock).

Debian's server binaries (``apt-get install postgresql``; scripts/setup.sh installs them where it runs as
root) start on a new data folder, listening only on 127.0.0.1 at a free port, with its socket in the data
folder; `stop` ends the postmaster by the PID it wrote and removes the folder. PostgreSQL refuses to run
as root, so as root the server runs as the ``postgres`` user the package creates.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL = "apt-get install -y postgresql (scripts/setup.sh does it when run as root)"


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(folder, "initdb").exists() and Path(folder, "pg_ctl").exists():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``url(user, password)``; ``psql(sql)`` as the superuser; ``restart()``; ``stop()`` (always)."""

    def __init__(self):
        self.bin = binaries()
        if self.bin is None:
            raise RuntimeError(f"PostgreSQL server binaries not found: {INSTALL}")
        self.as_user = "postgres" if os.geteuid() == 0 else None
        self.folder = Path(tempfile.mkdtemp(prefix="perfgate-pg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.superuser = "perfgate_admin"
        if self.as_user:
            entry = pwd.getpwnam(self.as_user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        pwfile = self.folder / "pw"
        pwfile.write_text("admin-secret\n")
        if self.as_user:
            os.chown(pwfile, pwd.getpwnam(self.as_user).pw_uid, -1)
        self._run(["initdb", "-D", str(self.data), "-U", self.superuser, "--pwfile", str(pwfile), "-A",
                   "scram-sha-256", "-E", "UTF8", "--no-sync"])
        pwfile.unlink()
        self.pid: int | None = None
        self.start()

    def _run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        argv = [str(self.bin / argv[0]), *argv[1:]]
        if self.as_user:
            argv = ["runuser", "-u", self.as_user, "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.folder, **kw)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[-600:]}")
        return out

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.folder} " \
               f"-c fsync=off -c max_connections=60"
        self._run(["pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.folder / "log"), "-w", "-t", "60",
                   "start"])
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def stop_server(self, *, fast: bool = True) -> None:
        """End the postmaster by its PID (SIGINT: fast shutdown, SIGQUIT: immediate) and wait for it."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGINT if fast else signal.SIGQUIT)
        except ProcessLookupError:
            self.pid = None
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def restart(self) -> None:
        self.stop_server(fast=False)
        self.start()

    def stop(self) -> None:
        self.stop_server(fast=False)  # throw-away data: no checkpoint to wait for
        shutil.rmtree(self.folder, ignore_errors=True)

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        env = dict(os.environ, PGPASSWORD="admin-secret")
        return self._run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                          self.superuser, "-d", database, "-v", "ON_ERROR_STOP=1", "-Atc", sql], env=env).stdout

    def url(self, user: str | None = None, password: str | None = None, database: str = "perfgate") -> str:
        user = user or self.superuser
        password = password or "admin-secret"
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(database=name)
