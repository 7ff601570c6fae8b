"""Which (config, workload) pairs of the suites a kind of test runs on.

A test marked ``qwenperf_select(name)`` runs on the pairs :data:`SELECTORS` ``[name]``
keeps; a test with no mark on every pair (``all``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_qwenperf.suite.config import ServingConfig, Suite, SuiteWorkload, Tier
from pytest_qwenperf.suite.workloads import SharedPrefixWorkload, TraceWorkload


def _first_workload(suite: Suite, cfg: ServingConfig, wl: SuiteWorkload) -> bool:
    """Whether ``wl`` is the first workload that runs on ``cfg``: a test per config, not per workload."""
    return wl is next(w for w in suite.workloads if w.runs_on(cfg.id))


SELECTORS: dict[str, Callable[[Suite, ServingConfig, SuiteWorkload], bool]] = {
    "all": lambda suite, cfg, wl: True,
    "ladder": lambda suite, cfg, wl: cfg.improves and cfg.inherits is not None and wl.runs_on(cfg.inherits) and wl.search is None,
    "slo": lambda suite, cfg, wl: wl.slo is not None,
    "speculative": lambda suite, cfg, wl: cfg.speculative,
    "canary": _first_workload,
    "canary-floor": lambda suite, cfg, wl: cfg.canary_floor is not None and _first_workload(suite, cfg, wl),
    "utilization": lambda suite, cfg, wl: any(wl.floor(name, cfg.id) is not None for name in ("gpu_utilization", "server_cpu_busy")),
    "scaling": lambda suite, cfg, wl: cfg.replicas > 1,
    "prefix-cache": lambda suite, cfg, wl: (
        isinstance(wl.workload, SharedPrefixWorkload)
        and "--enable-prefix-caching" in cfg.vllm_args
        and cfg.inherits is not None
        and wl.runs_on(cfg.inherits)
    ),
    "trace": lambda suite, cfg, wl: isinstance(wl.workload, TraceWorkload),
    "capacity": lambda suite, cfg, wl: wl.search is not None,
    "capacity-order": lambda suite, cfg, wl: bool(wl.capacity_order) and cfg.id == wl.capacity_order[-1][0],
}
"""``ladder`` compares a rung with the one it inherits from (at one load: a search workload's
rungs are ordered by ``capacity-order`` instead), ``prefix-cache`` a cached rung with
its uncached parent on a shared-prefix workload, ``utilization`` pairs with a utilization floor,
``trace`` the pairs that replay a trace, ``capacity`` those of a search workload and
``capacity-order`` one per workload that orders its configs' capacities (on the last of them), ``scaling`` configs of several replicas (every config when deployed endpoint sets are measured),
``canary`` every config once and ``canary-floor`` once each rung held to the canary answer of the
one it inherits (a speculative rung, or one with a ``canary`` table: see
:attr:`~pytest_qwenperf.suite.config.ServingConfig.canary_floor`), on its first workload: the
canary is per config, not per workload."""


def _order(suite: Suite, cfg: ServingConfig, wl: SuiteWorkload) -> tuple[str, ...]:
    return tuple(config_id for config_id, _ in wl.capacity_order)


def _parent(suite: Suite, cfg: ServingConfig, wl: SuiteWorkload) -> tuple[str, ...]:
    return (cfg.inherits,) if cfg.inherits is not None else ()


ALSO_MEASURED: dict[str, Callable[[Suite, ServingConfig, SuiteWorkload], tuple[str, ...]]] = {
    "ladder": _parent,
    "prefix-cache": _parent,
    "canary-floor": _parent,
    "capacity-order": _order,
}
"""The configs besides its own that a test of a selector measures (booting them where a session has not)."""


def tier_of(selector: str, suite: Suite, cfg: ServingConfig, wl: SuiteWorkload) -> Tier:
    """A test's tier on a pair: weekly where the workload, the config or a config the test also
    measures (:data:`ALSO_MEASURED`) is, else nightly: a nightly test never boots a weekly config."""
    also = ALSO_MEASURED.get(selector, lambda *_: ())(suite, cfg, wl)
    configs = [cfg, *(suite.config(config_id) for config_id in also)]
    return "weekly" if wl.tier == "weekly" or any(c.tier == "weekly" for c in configs) else "nightly"


@dataclass(frozen=True)
class Pair:
    """One (config, workload) pair a test runs on, with the suite that defines both."""

    suite: Suite
    config: ServingConfig
    workload: SuiteWorkload


def selected_pairs(suites: Sequence[Suite], selector: str, *, deployed_sets: bool = False) -> tuple[Pair, ...]:
    """The pairs of ``suites`` that ``selector`` keeps, in suite, workload, config order.

    With ``deployed_sets`` (replicas already deployed, per replica count) the sets are what
    scales, so ``scaling`` keeps every config. Raises :class:`ValueError` naming the
    selectors when ``selector`` is none of them.
    """
    if selector not in SELECTORS:
        raise ValueError(f"qwenperf_select({selector!r}): expected one of {sorted(SELECTORS)}")
    keep = SELECTORS["all" if selector == "scaling" and deployed_sets else selector]
    return tuple(
        Pair(suite, cfg, workload)
        for suite in suites
        for workload in suite.workloads
        for cfg in suite.configs
        if workload.runs_on(cfg.id) and keep(suite, cfg, workload)
    )
