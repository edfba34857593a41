"""Decode tokens/s of engines other than vLLM, through configured external commands.

Each [[command]] in perf/serving/decode_commands.toml (or $PERFGATE_DECODE_COMMANDS) is one
test; its tokens/s samples (llama-bench's per-repetition samples_ts, or every regex match)
are recorded as `decode_tok_s` and gated like any throughput. See docs/serving.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fixtures.cases import parametrize_cases
from perfgate.workloads.serving import decode_command_cases
from perfgate.workloads.serving.decode_command import load_decode_commands, run_decode_command

CONFIG = Path(os.environ.get("PERFGATE_DECODE_COMMANDS") or Path(__file__).with_name("decode_commands.toml"))
COMMANDS = load_decode_commands(CONFIG)


@parametrize_cases(decode_command_cases(COMMANDS))
def test_external_decode(perf, case, serving_models, tmp_path):
    """Gates nothing on the CPU machine: decode tok/s is absolute (gated on GPU hardware ids); the
    command's output must parse and every repetition must produce tokens (asserted)."""
    command = case.values
    missing = command.missing()
    if missing:
        pytest.skip(f"decode command {command.name!r} ({CONFIG.name}): {', '.join(missing)}")
    from perfgate.workloads.serving import CPU_PROFILE
    argv = " ".join(command.argv)
    placeholders = {"python": sys.executable}
    for kind in ("dense", "moe"):  # built only when the command uses them (tokenizers, transformers)
        if f"{{{kind}_model_dir}}" in argv:
            placeholders[f"{kind}_model_dir"] = str(serving_models(CPU_PROFILE, kind).path)
    result = run_decode_command(command, placeholders, cwd=tmp_path)
    assert all(x > 0 for x in result.tok_s), f"non-positive tokens/s from {result.argv}: {result.tok_s}"
    perf.record("decode_tok_s", result.tok_s, unit="tok/s", better="higher")
    perf.attach("command", {"argv": result.argv, "wall_s": result.wall_s, "tok_s": result.tok_s,
                            "stdout_tail": result.stdout_tail})
