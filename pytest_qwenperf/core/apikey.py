"""The API key of servers run with vLLM's ``--api-key``: where it comes from, and keeping it out of every written line.

What vLLM 0.32 does with a key (``vllm/entrypoints/serve/middleware/register.py`` and
``authenticate.py``, checked in the installed release):

* It requires a key when ``--api-key`` is given (one or more values, ``nargs="+"``) or,
  without that option, when ``VLLM_API_KEY`` is set and not empty in the server's
  environment; the option wins over the variable.
* Only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` need
  ``Authorization: Bearer <key>`` (anything else is answered ``401 {"error": "Unauthorized"}``).
  ``/health``, ``/version``, ``/metrics``, ``/reset_prefix_cache`` and ``OPTIONS``
  requests are open, so readiness probes, scrapes and cache resets need no key; listing
  ``/v1/models`` and every completion do.
* vLLM itself does not print the key: its ``non-default args:`` line replaces
  ``api_key`` by ``***``, a key from the environment is no argument at all, and dev mode's
  ``/server_info`` leaves out ``VLLM_*`` variables whose name contains ``KEY``.

Hence: servers this package starts get the key as ``VLLM_API_KEY`` in their environment,
never in their argv (which ``ps`` shows to every user and which log headers record); the
key travels as an :class:`ApiKey`, whose ``repr`` never shows it; and every argv that is
printed, logged or written goes through :func:`redact_argv`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SERVER_ENV = "VLLM_API_KEY"
"""The variable vLLM reads the key from; servers we start get the key only through it."""

CLIENT_ENVS = (SERVER_ENV, "OPENAI_API_KEY")
"""Where clients look for the key when none is named, first found wins (``OPENAI_API_KEY``
is what ``vllm bench serve`` and the OpenAI clients read)."""

REDACTED = "***"

_OPTION = "--api-key"
_SHORTEST_PREFIX = len("--api-k")  # vLLM's parser takes abbreviations; ``--api`` alone is ambiguous (--api-server-count)


class ApiKeyError(ValueError):
    """A key that cannot be used; the message names its source, never the key."""


@dataclass(frozen=True)
class ApiKey:
    """A bearer token and where it came from (an option or a variable name); ``repr`` shows only the source."""

    value: str = field(repr=False)
    source: str

    def __post_init__(self) -> None:
        if not self.value:
            raise ApiKeyError(f"{self.source}: the API key is empty")
        if not (self.value.isascii() and self.value.isprintable()) or self.value != self.value.strip():
            # It goes into an HTTP header line as it is: no control characters, nothing that
            # HTTP would strip (the server would compare a different key).
            raise ApiKeyError(f"{self.source}: the API key must be printable ASCII without leading or trailing spaces")

    def header_line(self) -> str:
        """The request header that carries it, with its line end."""
        return f"Authorization: Bearer {self.value}\r\n"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"}


def key_from_environment(environ: Mapping[str, str], name: str | None = None) -> ApiKey | None:
    """The key in variable ``name`` (which must then be set), else in the first of
    :data:`CLIENT_ENVS` that is set and not empty, else None."""
    if name is not None:
        if not environ.get(name):
            raise ApiKeyError(f"environment variable {name} is not set or empty; it should hold the servers' API key")
        return ApiKey(environ[name], name)
    found = next((var for var in CLIENT_ENVS if environ.get(var)), None)
    return ApiKey(environ[found], found) if found else None


def resolve_api_key(option: str | None, environ: Mapping[str, str]) -> ApiKey | None:
    """The command line's ``--api-key``, else ``VLLM_API_KEY``, else ``OPENAI_API_KEY``."""
    if option is not None:
        return ApiKey(option, _OPTION)
    return key_from_environment(environ)


def is_api_key_option(arg: str) -> bool:
    """Whether ``arg`` (``--api-key``, ``--api_key=K``, an abbreviation vLLM accepts) names vLLM's key option."""
    name = arg.partition("=")[0].replace("_", "-")
    return len(name) >= _SHORTEST_PREFIX and _OPTION.startswith(name)


def shown_command(argv: Iterable[str], limit: int = 200) -> str:
    """``argv`` as one line for a message about a process: any key masked, cut at ``limit`` characters."""
    return " ".join(redact_argv(argv))[:limit]


def redact_argv(argv: Iterable[str]) -> list[str]:
    """``argv`` with every key given to ``--api-key`` replaced by :data:`REDACTED`:
    ``--api-key K [K ...]`` (vLLM takes several; each value up to the next option) and ``--api-key=K``."""
    redacted: list[str] = []
    in_keys = False
    for arg in argv:
        if in_keys and not arg.startswith("-"):
            redacted.append(REDACTED)
            continue
        in_keys = False
        if is_api_key_option(arg) and "=" in arg:
            redacted.append(f"{arg.partition('=')[0]}={REDACTED}")
        else:
            in_keys = is_api_key_option(arg)
            redacted.append(arg)
    return redacted
