"""The ``qwenperf`` command: a thin dispatcher over one module per subcommand.

A subcommand's module is imported only when it runs (``--help`` imports them all), so
``qwenperf compare`` pays for the gate alone, not for the servers and the load generator
``qwenperf bench`` needs. Each module has ``HELP``, ``DESCRIPTION``, ``ERRORS`` (the bad-input
exceptions that end it with one line and exit status 2), ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType

COMMANDS = {
    "tiny-model": "tiny_model",
    "trace": "trace",
    "lint": "lint",
    "show": "show",
    "render-k8s": "render_k8s",
    "bench": "bench",
    "plan": "plan",
    "compare": "compare",
    "report": "report",
    "history": "history",
    "baseline": "baseline",
    "bisect": "bisect",
    "doctor": "doctor",
}
"""Subcommand → module of this package."""


def _module(command: str) -> ModuleType:
    return importlib.import_module(f"{__package__}.{COMMANDS[command]}")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser, with the arguments of the subcommand ``argv`` names (of all, when it names none)."""
    parser = argparse.ArgumentParser(prog="qwenperf", description="Performance gates for vLLM upgrades and serving-config changes.")
    commands = parser.add_subparsers(dest="command", required=True)
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    for command in COMMANDS:
        if named in COMMANDS and command != named:
            commands.add_parser(command)  # listed in errors and usage; its arguments are not needed
            continue
        module = _module(command)
        sub = commands.add_parser(command, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(sub)
        sub.set_defaults(module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. SIGTERM takes Ctrl-C's path (inside an asyncio run, asyncio's own SIGINT
    handler cancels the tasks) and either ends with one line and exit status 128 + the signal's number."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    module: ModuleType = args.module
    terminated = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True
        on_sigint = signal.getsignal(signal.SIGINT)
        if not callable(on_sigint):  # SIGINT ignored (a background job): there is no handler to take
            raise KeyboardInterrupt
        on_sigint(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return int(module.run(args))
    except module.ERRORS as exc:
        print(f"qwenperf: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a bench run says how far it got in the exception
        received = signal.SIGTERM if terminated else signal.SIGINT
        print(f"qwenperf: interrupted by {received.name}{f' {exc}' if str(exc) else ''}", file=sys.stderr)
        return 128 + received
    except BrokenPipeError:  # `qwenperf compare ... | head`: the reader left; end quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
