"""The machine something was measured on, as every record keeps it: one record, one spelling per field.

A run (``context.machine``), a baseline and a stored canary answer (``context.machine``), the
session's JSON and doctor's report (``machine``) and pytest-benchmark's ``extra_info`` hold this
record; :func:`pytest_qwenperf.serving.hardware.detect` finds it on this machine. The server's own
report of its software (:class:`~pytest_qwenperf.core.environment.Environment`) spells the fields
it shares with it alike: ``gpu_name``, ``gpu_count``, ``driver``, ``cuda``.

Records written before there was one spelling are still read (:func:`upgraded`): a run's
``context.hardware`` table and a baseline's flat ``context.gpu_name`` ... ``context.cpu_count``
become ``context.machine``, with ``driver_version`` and ``cuda_version`` read as ``driver`` and ``cuda``.
"""

from __future__ import annotations

import msgspec

from pytest_qwenperf.core.schema import Count


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    """What measured: the device and its driver, and the host's CPU."""

    kind: str | None = None  # "cpu", or a GPU kind ("b200", "h200")
    id: str | None = None  # what baselines are tied to: the GPU kind, or the CPU model and core count ("cpu-amd-epyc-2c")
    gpu_name: str | None = None  # NVML's product name ("NVIDIA H200")
    gpu_count: Count | None = None
    driver: str | None = None  # the NVIDIA driver's version
    cuda: str | None = None  # the CUDA version the driver supports ("12.8")
    cpu_model: str | None = None
    cpu_count: Count | None = None  # the CPUs the measuring process may run on

    def known(self) -> Machine:
        """The record with an empty text (an unknown CPU model) as null, as stored records keep it."""
        return msgspec.structs.replace(
            self, **{name: None for name in self.__struct_fields__ if getattr(self, name) == ""}
        )


RENAMED = {"driver_version": "driver", "cuda_version": "cuda"}
"""Field names records used before there was one spelling → today's."""

FLAT = ("gpu_name", "gpu_count", "driver_version", "cuda_version", "cpu_model", "cpu_count")
"""The machine's fields a baseline's or canary answer's ``context`` held flat before ``context.machine``."""


def upgraded(record: object) -> object:
    """A stored record (a run, a baseline or one of its history entries, a canary answer) with its
    ``context`` upgraded (:func:`upgraded_context`); anything else as it is."""
    if isinstance(record, dict) and "context" in record:
        return record | {"context": upgraded_context(record["context"])}
    return record


def upgraded_context(context: object) -> object:
    """A stored ``context`` table with its machine in today's shape: a run's ``hardware`` table, or a
    baseline's flat fields, as ``machine``, old names renamed (where both spellings are present, the
    new one wins). A table that already has ``machine`` is left as it is, and so is anything that is
    not a table: the schema names what is wrong with it."""
    if not isinstance(context, dict) or "machine" in context:
        return context
    upgraded = dict(context)
    if "hardware" in upgraded:
        old = upgraded.pop("hardware")
    else:
        old = {name: upgraded.pop(name) for name in FLAT if name in upgraded} or None
    upgraded["machine"] = _renamed(old) if isinstance(old, dict) else old
    return upgraded


def _renamed(fields: dict[str, object]) -> dict[str, object]:
    renamed = {RENAMED.get(name, name): value for name, value in fields.items() if name in RENAMED}
    return renamed | {name: value for name, value in fields.items() if name not in RENAMED}
