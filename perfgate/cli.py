"""`perfgate` console script: one sub-command per module in perfgate/commands/.

Each command module exposes ``register(subparsers)`` and ``run(args) -> int``; adding a
command is adding a module to COMMANDS.

Signals: from this file's first statements to the process's exit, SIGINT and SIGTERM end
the command with one line and an exit code that tells the truth (perfgate.interrupts):
130 (143 for SIGTERM) and "nothing was written" when no write had begun, 0 when the
writes had completed. Commands hold signals while they write, so a baseline refresh is
never left half done.
"""
from __future__ import annotations

import signal
import sys


def _interrupted_while_starting(signum, frame):
    """Until main() takes over (imports are still running): nothing can have been written."""
    print("perfgate: interrupted; nothing was written", file=sys.stderr)
    raise SystemExit(128 + signum)


_AS_PROGRAM = __name__ == "__main__" or sys.argv[0].endswith(("/perfgate", "perfgate.exe")) or sys.argv[0] == "perfgate"
if _AS_PROGRAM:  # not when a test or a library imports this module: their signals stay theirs
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _interrupted_while_starting)

import argparse  # noqa: E402  (after the handlers: a Ctrl-C during the imports prints one line)
import importlib  # noqa: E402
import threading  # noqa: E402

from perfgate import interrupts  # noqa: E402

COMMANDS = ("fingerprint", "refresh", "compare", "report", "calibrate", "import_baselines", "trends", "ab", "power",
            "store", "verify_baselines", "serve")


def _version() -> str:
    """The installed distribution's version (what a bug report should name)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perfgate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfgate", description="performance regression gates for LLM stacks")
    parser.add_argument("--version", action="version", version=f"perfgate {_version()}")
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


class _Signalled(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _ignore_signals() -> None:
    interrupts.set_handlers({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN})


def _raise(signum, frame):
    _ignore_signals()  # one signal ends the command; a second must not interrupt its last line
    raise _Signalled(signum)


def main(argv: list[str] | None = None) -> int:
    """Run one command. ``argv=None`` means "as the program": after it, signals are ignored until exit,
    so a Ctrl-C after a complete write cannot turn exit 0 into 130."""
    as_program = argv is None
    interrupts.reset()
    old = {}
    if threading.current_thread() is threading.main_thread():
        old = interrupts.set_handlers({signal.SIGINT: _raise, signal.SIGTERM: _raise})
    command = "?"
    try:
        parser = build_parser()
        try:  # every option is checked here, as parsed (perfgate.options.number), before a command starts
            args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse said what is wrong (exit 2) or printed --help (0)
            return exc.code if isinstance(exc.code, int) else 2
        command = args.command
        rc = int(args.func(args) or 0)
        if old:
            _ignore_signals()  # the command is done: a late Ctrl-C must not change its exit code
        note = interrupts.deferred_note()
        if note:
            print(note, file=sys.stderr)
        return rc
    except KeyboardInterrupt as exc:
        rc, line = interrupts.outcome(getattr(exc, "signum", signal.SIGINT))
        print(line, file=sys.stderr)
        return rc
    except BrokenPipeError:
        # The reader left early (`perfgate compare A B | head`): it has what it wanted. End as a
        # pipeline's writer does, quietly, with SIGPIPE's exit status.
        if old:
            _ignore_signals()
        interrupts.stdout_to_devnull()
        return 128 + signal.SIGPIPE
    except (ValueError, OSError) as exc:  # our errors carry the file and the fix
        if old:
            _ignore_signals()
        from perfgate.report.errors import os_error

        said = f"{os_error(exc)}; check that path and its permissions, then re-run" if isinstance(exc, OSError) else exc
        print(f"perfgate {command}: error: {said}", file=sys.stderr)
        return 2
    finally:
        if old:
            interrupts.set_handlers({sig: signal.SIG_IGN if as_program else handler for sig, handler in old.items()})


if __name__ == "__main__":
    sys.exit(main())
