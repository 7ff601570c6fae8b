"""Every option of the pytest plugin, declared once: its flag, value parser, help and ini key, and
the ``qwenperf`` commands that take the same option (``--<name>``, same parser, same help), as
pytest-benchmark shares its option groups between its plugin and its CLI.

The plugin registers each as ``--qwenperf-<name>`` (:func:`add_plugin_options`); a command registers
those it shares with :meth:`Option.add`. ``python -m pytest_qwenperf.cli.reference`` writes the
reference page of the docs from it (``docs/reference.md``; ``tests/test_option_table.py`` keeps them equal).

Some commands have a flag of the same name that means something else, and it is theirs alone:
``--json`` of ``compare``, ``show``, ``doctor``, ``history``, ``baseline`` and ``plan`` is an output
format (the plugin's and ``bench``'s name a file); ``plan --candidate`` says a session measures one
(the plugin's is its launcher); ``baseline --replace-published`` allows one promotion (the plugin's
names configs); ``bench --progress`` switches a bar (the plugin's paces status lines); ``plan
--history`` and ``report --history`` read a store (the plugin's and ``bench``'s record into one);
``bisect --suite``, ``--log-dir`` and ``doctor --suite`` take one suite or a default folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pytest_qwenperf.core.apikey import CLIENT_ENVS
from pytest_qwenperf.core.options import (
    DEFAULT_BOOT_TIMEOUT_S,
    DEFAULT_HISTORY,
    cpu_list,
    endpoint_url,
    launcher_argv,
    positive_seconds,
    progress_setting,
    whole_number,
)

if TYPE_CHECKING:
    from pytest_qwenperf.serving.endpoints import EndpointSets


def endpoints_file(value: str) -> EndpointSets:
    """:func:`pytest_qwenperf.serving.endpoints.endpoints_file`, imported when a value is parsed: the
    commands that share options with the plugin stay as light as they were (``qwenperf baseline``
    loads no serving code)."""
    from pytest_qwenperf.serving.endpoints import endpoints_file as parse

    return parse(value)


PLUGIN = "pytest"
"""The context name of the plugin, beside the commands' names, in :attr:`Option.notes`."""


@dataclass(frozen=True)
class Ini:
    """The plugin's ini key for an option: the option's default where the command line does not give it."""

    type: Literal["string", "linelist", "bool"] = "string"
    name: str = ""  # "": qwenperf_<the option's name with underscores>
    note: str = ""  # what the key adds to "default for --qwenperf-<name>"


@dataclass(frozen=True)
class Option:
    """One option. ``notes``: a sentence added to the help where one context (``"pytest"`` or a
    command) differs, such as its default; ``commands``: the ``qwenperf`` commands that take it."""

    name: str
    help: str
    type: Callable[[str], object] | None = None
    metavar: str | None = None
    action: Literal["store_true", "append"] | None = None
    ini: Ini | None = None
    commands: tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def plugin_flag(self) -> str:
        return f"--qwenperf-{self.name}"

    @property
    def ini_key(self) -> str | None:
        if self.ini is None:
            return None
        return self.ini.name or "qwenperf_" + self.name.replace("-", "_")

    def help_in(self, context: str) -> str:
        note = self.notes.get(context, "")
        return f"{self.help} {note}" if note else self.help

    def add(self, add_option: Callable[..., object], context: str, **fixed: object) -> None:
        """Register it with ``add_option`` (argparse's ``add_argument`` or pytest's ``addoption``) as
        ``context`` names it: ``--qwenperf-<name>`` for the plugin, ``--<name>`` for a command.
        ``fixed``: what the command alone decides, ``default`` or ``required``."""
        if context != PLUGIN and context not in self.commands:
            raise ValueError(f"option {self.name!r} is not declared for {context!r} (its commands: {self.commands})")
        kwargs: dict[str, object] = {"help": self.help_in(context)}
        if self.type is not None:
            kwargs["type"] = self.type
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.action == "append":
            kwargs.update(action="append", default=[])
        elif self.action == "store_true":
            # None where not given: the plugin then reads the ini key
            kwargs.update(action="store_true", default=None if self.ini is not None and context == PLUGIN else False)
        add_option(self.plugin_flag if context == PLUGIN else f"--{self.name}", **{**kwargs, **fixed})


OPTIONS: tuple[Option, ...] = (
    Option(
        "launcher",
        "command that starts a vLLM OpenAI server; model and flags are appended "
        "(default: python -m vllm.entrypoints.openai.api_server)",
        type=launcher_argv,
        ini=Ini(),
    ),
    Option(
        "candidate",
        "a second command that starts a vLLM OpenAI server (e.g. another vLLM version's). Each point is then "
        "measured on both servers, booted side by side, their repeats alternating, and the candidate's run is judged "
        "against the launcher's instead of the stored baseline. On GPU suites the two take turns on the GPUs through "
        "vLLM's sleep mode (both vLLMs must have it; the session says why before booting where they cannot).",
        type=launcher_argv,
        metavar="LAUNCHER",
        ini=Ini(),
    ),
    Option(
        "boot-timeout",
        f"seconds a server may take to become ready (default {DEFAULT_BOOT_TIMEOUT_S:.0f})",
        type=positive_seconds,
        metavar="S",
        ini=Ini(),
        commands=("bisect",),
    ),
    Option("log-dir", "folder for server logs (default: under pytest's basetemp)", type=Path, ini=Ini()),
    Option(
        "vllm-cache",
        "folder where booted servers keep vLLM's torch.compile and model-info caches (VLLM_CACHE_ROOT), kept across "
        "sessions so that a runner's next boots skip the compile (default: vLLM's own, ~/.cache/vllm)",
        type=Path,
        metavar="DIR",
        ini=Ini(),
    ),
    Option(
        "endpoint",
        "base URL of an already-running server; repeatable (requests go round-robin over them).",
        type=endpoint_url,
        action="append",
        ini=Ini(type="linelist", name="qwenperf_endpoints"),
        commands=("bench",),
        notes={PLUGIN: "Nothing is booted when given."},
    ),
    Option(
        "endpoints-file",
        "TOML file naming, per replica count, the endpoints of servers already deployed (e.g. on several "
        "nodes); every config is measured against each set for its scaling efficiency. Nothing is booted.",
        type=endpoints_file,
    ),
    Option(
        "api-key-env",
        f"environment variable holding the API key of servers run with vLLM's --api-key (default: {' or '.join(CLIENT_ENVS)} "
        "when set). Servers the plugin boots require it (given to them as VLLM_API_KEY) and every request carries it. "
        "The key itself is never an option: command lines are visible in ps and shell histories.",
        metavar="NAME",
        ini=Ini(note="(a variable name, never the key)"),
    ),
    Option(
        "suite",
        "suite file to run (repeatable; default: ini qwenperf_suites)",
        type=Path,
        action="append",
        ini=Ini(type="linelist", name="qwenperf_suites", note="(suite files or globs, relative to the rootdir)"),
    ),
    Option(
        "json",
        "write the results (every run, with what its servers cost) to this JSON file",
        type=Path,
        commands=("bench",),
        notes={PLUGIN: "(an existing file is kept aside under a name of its own)", "bench": "(an existing file is never overwritten)"},
    ),
    Option(
        "html",
        "write the session's report as one HTML file that opens offline: verdicts, throughput per rung, telemetry over "
        "time, latency distributions, environment differences (default: ini qwenperf_html; see qwenperf report)",
        type=Path,
        metavar="PATH",
        ini=Ini(note="(relative to the rootdir)"),
    ),
    Option("server-cpus", "CPUs for the servers, e.g. 0-6 (CPU suites default: all but the last)", type=cpu_list),
    Option(
        "client-cpus",
        "CPUs for the load generator, e.g. 1 or 8-15",
        type=cpu_list,
        commands=("bench",),
        notes={PLUGIN: "(CPU suites default: the last one)"},
    ),
    Option(
        "repeats",
        "load runs per (config, workload), on each side where two servers are compared (default: the suite's repeats)",
        type=whole_number(1),
        ini=Ini(),
        commands=("bisect",),
    ),
    Option(
        "max-repeats",
        "most load runs per (config, workload) and side: while a verdict is noisy or underpowered, one more is run and "
        "the point judged again (default: the suite's max_repeats, else the repeats: none extra)",
        type=whole_number(1),
        ini=Ini(),
        commands=("bisect",),
    ),
    Option(
        "client-workers",
        "load-generator processes, each with its own event loop, for loads one process cannot drive (default 1)",
        type=whole_number(1),
        ini=Ini(),
    ),
    Option(
        "ray",
        "run the load-generator processes as actors spread over the nodes of this Ray cluster (auto, host:port or "
        "ray://host:port; needs the ray extra), each on one CPU, their times put on this machine's clock",
        metavar="ADDRESS",
        ini=Ini(),
        commands=("bench",),
        notes={PLUGIN: "(how many: --qwenperf-client-workers)", "bench": "(how many: --workers)"},
    ),
    Option(
        "baselines",
        "the baselines folder",
        type=Path,
        ini=Ini(note="(relative to the rootdir)"),
        commands=("baseline", "compare", "bisect"),
        notes={
            PLUGIN: "(default: baselines/ under the rootdir)",
            "baseline": "(default: baselines)",
            "compare": "(with it, every FILE is judged against its own reference, as a session judges it: its stored "
            "baseline there, else its recent valid runs in --history; no FILE is a reference)",
            "bisect": "(with it, the good release is judged at every step against its own reference: its stored baseline "
            "there, else its recent valid runs in --history; a machine on which the good release is itself slow is named)",
        },
    ),
    Option(
        "history",
        "the history store: an SQLite file or a postgresql:// URL",
        metavar="STORE",
        ini=Ini(note="(a path relative to the rootdir, or a URL)"),
        commands=("bench", "compare", "bisect"),
        notes={
            PLUGIN: f"The session records its runs in it (created if absent) and judges a run without a stored baseline "
            f"against its recent valid runs there (default: {DEFAULT_HISTORY} under the rootdir; see qwenperf history).",
            "bench": "Record the run in it (created if absent; default: none).",
            "compare": "With --baselines: a run without a stored baseline is judged against its recent valid runs there "
            "(read only).",
            "bisect": "With --baselines: the good release without a stored baseline is judged against its recent valid "
            "runs there (read only).",
        },
    ),
    Option(
        "llmd-report",
        "also write each measured run as an llm-d Benchmark Report (version 0.2, JSON) into this folder, one file per run "
        "named by its config, workload and start (never one written before); what a run does not record is left out, "
        "not guessed (see docs/interchange.md)",
        type=Path,
        metavar="DIR",
        ini=Ini(note="(a path relative to the rootdir)"),
        commands=("bench",),
        notes={PLUGIN: "With a candidate, the launcher's runs go into DIR/reference/."},
    ),
    Option("no-history", "record the session's runs in no history store", action="store_true", ini=Ini(type="bool")),
    Option(
        "allow-invalid",
        "a run judged invalid (lost data, a client that could not keep up, a shared core or a throttled GPU) "
        "skips its tests with the reason instead of failing them; it never passes (default: fail)",
        action="store_true",
        ini=Ini(type="bool"),
    ),
    Option(
        "update-baselines",
        "after a session without failures, record its runs as the baselines and each config's canary answer beside "
        "them (the previous values move to history)",
        action="store_true",
    ),
    Option(
        "replace-published",
        "with --qwenperf-update-baselines: let the runs of this config (its key, e.g. b200/dp8) or this baseline "
        "file replace a baseline of published figures (repeatable; without it, published baselines are kept)",
        action="append",
        metavar="CONFIG_OR_FILE",
    ),
    Option(
        "progress",
        "each point's progress while it is measured: a status line redrawn in place in a terminal; in a log "
        "(no terminal), a line every SECONDS (default 30) and one per finished repeat. off: none (nor with -qq)",
        type=progress_setting,
        metavar="off|on|SECONDS",
        ini=Ini(note="(off, on or seconds)"),
    ),
    Option(
        "profile",
        "after the measured repeats, send the load once more between vLLM's /start_profile and /stop_profile and measure "
        "nothing of it: the torch profiler's traces go beside the JSON (<stem>.profiles/), the top operators by self "
        "time into the run.",
        action="store_true",
        ini=Ini(type="bool"),
        commands=("bench",),
        notes={
            PLUGIN: "The servers boot with the profiler on (--profiler-config); traces under <stem>.profiles/<suite>/<config>/<workload>/.",
            "bench": "The servers must run with vLLM's --profiler-config, in dev mode, on this host.",
        },
    ),
)

BY_NAME: Mapping[str, Option] = {option.name: option for option in OPTIONS}


def add_plugin_options(group_addoption: Callable[..., object], addini: Callable[..., object]) -> None:
    """Every option as ``--qwenperf-<name>`` and its ini key, in the table's order."""
    for option in OPTIONS:
        option.add(group_addoption, PLUGIN)
    for option in OPTIONS:
        if option.ini is not None:
            note = f" {option.ini.note}" if option.ini.note else ""
            kwargs: dict[str, object] = {"type": option.ini.type} if option.ini.type != "string" else {}
            if option.ini.type == "bool":
                kwargs["default"] = False
            addini(option.ini_key, f"default for {option.plugin_flag}{note}", **kwargs)
