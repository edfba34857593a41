"""Decode tokens/s from an external command (llama.cpp's `llama-bench -o json`, or anything
that prints tokens/s), so engines other than vLLM are gated like any other metric.

A command is described in TOML (perf/serving/decode_commands.toml, or the file named by
$PERFGATE_DECODE_COMMANDS)::

    [[command]]
    name = "llama-bench-q4"                       # test id suffix
    argv = ["llama-bench", "-m", "${GGUF}", "-p", "0", "-n", "128", "-r", "5", "-o", "json"]
    parser = "llama-bench-json"                   # or "regex"
    requires = ["llama-bench"]                    # executables; missing -> the test is skipped, saying which
    requires_env = ["GGUF"]                       # environment variables that must be set, likewise
    markers = ["cpu"]                             # which machines run it (cpu, 1gpu, ...)
    timeout_s = 600
    repeat = 1                                    # run the command this many times, pooling samples

argv items may use ``{python}`` (this interpreter), ``{dense_model_dir}`` / ``{moe_model_dir}``
(the suite's tiny models) and environment variables (``$VAR`` / ``${VAR}``).

Parsers:
- ``llama-bench-json``: llama-bench's JSON (or JSONL) array; every entry with n_gen > 0 and
  n_prompt == 0 (text generation) contributes its ``samples_ts`` (per-repetition tokens/s).
- ``regex``: every match of ``pattern`` (a regex with a named group ``tok_s``) in stdout is one
  sample, e.g. ``pattern = '(?P<tok_s>[0-9.]+) tokens/s'``.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import shutil
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

PARSERS = ("llama-bench-json", "regex")


class DecodeCommandError(RuntimeError):
    """The command failed, timed out, or printed nothing we could read tokens/s from."""


@dataclass(frozen=True)
class DecodeCommand:
    name: str
    argv: tuple[str, ...]
    parser: str = "llama-bench-json"
    pattern: str | None = None
    requires: tuple[str, ...] = ()
    requires_env: tuple[str, ...] = ()
    markers: tuple[str, ...] = ("cpu",)
    timeout_s: float = 600.0
    repeat: int = 1
    env: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        where = f"decode command {self.name!r}"
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", self.name or ""):
            raise ValueError(f"{where}: name must be letters, digits, '_', '.', '+' or '-' (it becomes a test id)")
        if not self.argv:
            raise ValueError(f"{where}: argv is empty")
        if self.parser not in PARSERS:
            raise ValueError(f"{where}: parser must be one of {PARSERS}, got {self.parser!r}")
        if self.parser == "regex":
            if not self.pattern:
                raise ValueError(f"{where}: parser 'regex' needs a pattern with a named group (?P<tok_s>...)")
            if "tok_s" not in re.compile(self.pattern).groupindex:
                raise ValueError(f"{where}: pattern {self.pattern!r} has no named group (?P<tok_s>...)")
        if self.repeat < 1 or self.timeout_s <= 0:
            raise ValueError(f"{where}: repeat must be >= 1 and timeout_s > 0")

    def missing(self) -> list[str]:
        """What this machine lacks for the command (a reason to skip, not to fail)."""
        return ([f"{exe} not on PATH" for exe in self.requires if shutil.which(exe) is None]
                + [f"${var} not set" for var in self.requires_env if not os.environ.get(var)])


@dataclass
class DecodeResult:
    tok_s: list[float]
    argv: list[str]
    wall_s: float
    stdout_tail: str


def load_decode_commands(path: Path | str) -> list[DecodeCommand]:
    """Parse a TOML file of [[command]] tables; a bad entry fails with the file and entry named."""
    path = Path(path)
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    out = []
    known = {"name", "argv", "parser", "pattern", "requires", "requires_env", "markers", "timeout_s", "repeat",
             "env"}
    for i, entry in enumerate(data.get("command", [])):
        unknown = set(entry) - known
        if unknown:
            raise ValueError(f"{path}: command #{i + 1}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        try:
            out.append(DecodeCommand(
                name=entry.get("name", ""), argv=tuple(entry.get("argv", ())),
                parser=entry.get("parser", "llama-bench-json"), pattern=entry.get("pattern"),
                requires=tuple(entry.get("requires", ())), requires_env=tuple(entry.get("requires_env", ())),
                markers=tuple(entry.get("markers", ("cpu",))),
                timeout_s=float(entry.get("timeout_s", 600.0)), repeat=int(entry.get("repeat", 1)),
                env=tuple((str(k), str(v)) for k, v in entry.get("env", {}).items())))
        except ValueError as exc:
            raise ValueError(f"{path}: command #{i + 1}: {exc}") from None
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: command names must be unique, got {names}")
    return out


def parse_llama_bench_json(text: str) -> list[float]:
    """Per-repetition tokens/s of llama-bench's text-generation tests (JSON array or JSONL)."""
    text = text.strip()
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise DecodeCommandError("no JSON in the output (was llama-bench run with -o json?)")
    body = text[start:]
    try:
        entries = json.loads(body)
    except json.JSONDecodeError:
        entries = [json.loads(line) for line in body.splitlines() if line.strip().startswith("{")]
    if isinstance(entries, dict):
        entries = [entries]
    samples: list[float] = []
    for e in entries:
        if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
            samples.extend(float(x) for x in (e.get("samples_ts") or [e["avg_ts"]]))
    if not samples:
        raise DecodeCommandError("no text-generation entry (n_gen > 0, n_prompt == 0) in llama-bench's JSON; "
                                 "run it with -p 0 -n N, or keep its default tg test")
    return samples


def parse_regex(text: str, pattern: str) -> list[float]:
    samples = [float(m.group("tok_s")) for m in re.finditer(pattern, text)]
    if not samples:
        raise DecodeCommandError(f"pattern {pattern!r} matched nothing in the output")
    return samples


def expand_argv(cmd: DecodeCommand, placeholders: Mapping[str, str]) -> list[str]:
    """Fill {placeholders} and $ENV variables in each argv item; an unknown {name} is an error."""
    out = []
    for item in cmd.argv:
        try:
            item = item.format_map(dict(placeholders))
        except KeyError as exc:
            raise ValueError(f"decode command {cmd.name!r}: unknown placeholder {exc} in {item!r}; "
                             f"known: {sorted(placeholders)}") from None
        out.append(os.path.expandvars(item))
    return out


def run_decode_command(cmd: DecodeCommand, placeholders: Mapping[str, str],
                       cwd: Path | None = None) -> DecodeResult:
    """Run the command `repeat` times and return every tokens/s sample it printed."""
    argv = expand_argv(cmd, placeholders)
    env = {**os.environ, **dict(cmd.env)}
    samples: list[float] = []
    t0 = time.monotonic()
    stdout = ""
    for _ in range(cmd.repeat):
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise DecodeCommandError(f"{cmd.name}: {argv[0]} not found") from None
        try:
            stdout, stderr = proc.communicate(timeout=cmd.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the command may have children
            proc.communicate()
            raise DecodeCommandError(f"{cmd.name}: {argv[0]} ran past {cmd.timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise DecodeCommandError(f"{cmd.name}: {' '.join(argv)} exited {proc.returncode}:\n"
                                     f"{(stderr or stdout)[-2000:]}")
        if cmd.parser == "llama-bench-json":
            samples.extend(parse_llama_bench_json(stdout))
        else:
            samples.extend(parse_regex(stdout, cmd.pattern or ""))
    return DecodeResult(tok_s=samples, argv=argv, wall_s=time.monotonic() - t0, stdout_tail=stdout[-2000:])
