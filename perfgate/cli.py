"""`perfgate` console script: one sub-command per module in perfgate/commands/.

Each command module exposes ``register(subparsers)`` and ``run(args) -> int``; adding a
command is adding a module to COMMANDS.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("fingerprint", "refresh", "compare", "report", "calibrate", "import_seed", "ab", "power")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfgate", description="performance regression gates for LLM stacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"perfgate.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"perfgate.commands.{name}":
                continue  # command not shipped in this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("perfgate: interrupted; nothing was written", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # our errors carry the file and the fix
        print(f"perfgate {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
