"""Decode tokens/s of engines other than vLLM, through configured external commands.

Each [[command]] in perf/serving/decode_commands.toml (or $PERFGATE_DECODE_COMMANDS) is one
test; its tokens/s samples (llama-bench's per-repetition samples_ts, or every regex match)
are recorded as `decode_tok_s` and gated like any throughput. See docs/serving.md.
"""
from __future__ import annotations

import os
from pathlib import Path

from fixtures.cases import parametrize_cases, record
from perfgate.workloads import serving
from perfgate.workloads.serving.decode_command import load_decode_commands

CONFIG = Path(os.environ.get("PERFGATE_DECODE_COMMANDS") or Path(__file__).with_name("decode_commands.toml"))


@parametrize_cases(serving.decode_command_cases(load_decode_commands(CONFIG), CONFIG.name))
def test_external_decode(perf, servers, case):
    """Gates nothing on the CPU machine: decode tok/s is absolute (gated on GPU hardware ids); the
    command's output must parse and every repetition must produce tokens (checked)."""
    record(perf, serving.AREA.run(servers, case))
