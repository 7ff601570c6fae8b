"""Serving configurations: what to start, as data.

A :class:`ServingConfig` is one rung of a ladder: a model, the vLLM arguments and the
environment that go with it. Rendering it to a launch spec is a pure function; nothing
here starts a process.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_qwenperf.server import ServerSpec


@dataclass(frozen=True)
class ServingConfig:
    """One serving configuration, identified by ``id`` across runs and baselines."""

    id: str
    model: str
    vllm_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    served_model_name: str | None = None

    def server_spec(self, *, launcher: tuple[str, ...], boot_timeout_s: float) -> ServerSpec:
        return ServerSpec(
            model=self.model,
            args=self.vllm_args,
            name=self.id,
            served_model_name=self.served_model_name,
            env=self.env,
            launcher=launcher,
            boot_timeout_s=boot_timeout_s,
        )
