"""A `vllm serve` that is already running on this machine, measured instead of one the suite starts.

Why: a server start costs 70-140 s (compile, CUDA-graph capture), and `perfgate ab` runs pytest
twice a round, so a serving A/B of four rounds was eight starts, ~15 min of a 30-minute GPU job. Two
servers started once (say vLLM 0.23 in one venv, 0.24 in another, or one with a planted knob) and
attached per side make a round one load run against each:

    perfgate ab --a-env PERFGATE_SERVING_URL=http://127.0.0.1:8001 \\
                --b-env PERFGATE_SERVING_URL=http://127.0.0.1:8002 -- -m 1gpu -k gpu-dense perf/serving

``PERFGATE_SERVING_URL`` stands for the profile's default dense server only (prefix caching on, the
flags it was started with); a test that needs another configuration (prefix caching off, eager, a
small KV cache, the MoE model) is skipped, saying so. The URL must be on the loopback (the suite
never loads a remote host). The served model's directory must be on this machine (its tokenizer
picks the prompt token ids): the id `/v1/models` reports, or ``PERFGATE_SERVING_MODEL``.

What the suite cannot know about a server it did not start is said, not guessed: its flags
(the identity records ``engine_args: attached (flags not known)``, so such a run is judged against
no baseline measured with known flags: ``not-comparable``, the right verdict for a plain run; an A/B
compares its two sides only), its log (none to show), and a planted test-only mutation (set where
the server starts; asking for one on the pytest side is an error, as it would silently do nothing).
The server's process is found by its listening port (psutil), so its memory is still watched, and its
CPU and GPU use count as the session's own (perfgate.machine.cpu_use.own_pids), not a neighbour's that
would taint the run.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from perfgate.machine.cpu_use import ATTACHED_SERVER_ENV, listening_pid
from perfgate.workloads.serving.server import health_ok

ENV = ATTACHED_SERVER_ENV
LOOPBACK = ("127.0.0.1", "localhost", "::1")
ATTACHED_FLAGS = ("attached (flags not known)",)


class AttachError(ValueError):
    """The attached server cannot be used; the message says why and what to do."""


def parse_url(text: str) -> str:
    """``http://127.0.0.1:PORT`` (or localhost, [::1]) without a path: the base URL, else AttachError."""
    try:
        url = urllib.parse.urlsplit(text.strip())
        port = url.port
    except ValueError as exc:
        raise AttachError(f"{ENV}={text!r}: not a URL ({exc})") from None
    if url.scheme != "http" or url.hostname not in LOOPBACK or port is None:
        raise AttachError(f"{ENV}={text!r}: give http://127.0.0.1:PORT (or localhost, [::1]): the suite loads "
                          f"servers on this machine's loopback only")
    if url.path not in ("", "/") or url.query or url.fragment:
        raise AttachError(f"{ENV}={text!r}: the server's base URL, without a path (the suite adds /v1/...)")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"http://{host}:{port}"


def _get_json(url: str, timeout_s: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode())


@dataclass
class AttachedServer:
    """What the serving fixtures and tests read of a server, for one they did not start."""

    url: str
    served_model: str            # the id requests name (`/v1/models`)
    model_dir: Path              # where its config and tokenizer are on this machine
    pid: int | None              # the listening process, None where it could not be found
    startup_s: float = 0.0
    log_path: Path | None = None
    token_pool: list[int] = field(default_factory=list, repr=False)  # prompt ids from its tokenizer (the fixtures)

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def model_name(self) -> str:
        return self.served_model

    @property
    def spec(self) -> SimpleNamespace:
        return SimpleNamespace(model=str(self.model_dir), engine_args=ATTACHED_FLAGS)

    @property
    def proc(self) -> SimpleNamespace:
        return SimpleNamespace(pid=self.pid, returncode=None)

    @property
    def argv(self) -> list[str]:
        return []

    def alive(self) -> bool:
        return health_ok(f"{self.url}/health")

    def log_tail(self, lines: int = 60) -> str:
        return f"(attached server at {self.url}: its log is wherever it was started)"

    def failure_log(self, lines: int = 60) -> str:
        return self.log_tail(lines)

    def kv_cache_tokens(self) -> int | None:
        return None

    def engine_init_s(self) -> float | None:
        return None

    def stop(self) -> None:
        """Not ours to stop: whoever started it ends it."""


def attach(text: str, model_dir: str | None = None, timeout_s: float = 10.0) -> AttachedServer:
    """Check the server at ``text`` answers /health and serves one model whose directory is on this
    machine (``model_dir`` where given, e.g. PERFGATE_SERVING_MODEL, else the id it reports)."""
    url = parse_url(text)
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            if resp.status != 200:
                raise AttachError(f"{ENV}={url}: /health answered {resp.status}")
        models = _get_json(f"{url}/v1/models", timeout_s).get("data") or []
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise AttachError(f"{ENV}={url}: no vLLM server answers there ({exc}); start one, or unset {ENV} to "
                          f"let the suite start its own") from None
    if len(models) != 1 or not isinstance(models[0], dict) or not isinstance(models[0].get("id"), str):
        raise AttachError(f"{ENV}={url}: /v1/models lists {len(models)} model(s); attach a server of one model")
    served = models[0]["id"]
    where = Path(model_dir or models[0].get("root") or served).expanduser()
    if not (where / "config.json").is_file() or not (where / "tokenizer.json").is_file():
        raise AttachError(f"{ENV}={url} serves {served!r}, whose directory is not on this machine ({where} has no "
                          f"config.json and tokenizer.json): set PERFGATE_SERVING_MODEL to it (its tokenizer picks "
                          f"the prompt token ids)")
    port = urllib.parse.urlsplit(url).port
    return AttachedServer(url=url, served_model=served, model_dir=where.resolve(), pid=listening_pid(port))
