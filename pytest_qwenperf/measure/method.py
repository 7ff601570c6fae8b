"""How a point is measured: one frozen value, built once, that every measuring function takes.

A *point* is a serving config × a workload. Besides the server, the config and the workload,
measuring one needs: the repeats and their sequential plan, the client's cores and worker
processes, the API key the servers require, the routes to the replicas when they were deployed
elsewhere, where its operator profile goes (if one is taken), and the suite's tolerances, validity limits and must-match fields (which travel with
the run, so a baseline recorded from it and ``qwenperf compare`` judge it as the suite says).
:meth:`Method.of` builds it from a suite; the plugin, ``qwenperf bisect`` and the benchmarks
build it there instead of handing each function a dozen keywords.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.sequential import SequentialPlan
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.core.verdict import DEFAULT_CONFIDENCE
from pytest_qwenperf.measure.observe import ClientSetup
from pytest_qwenperf.measure.profile import ProfileSetting
from pytest_qwenperf.measure.scaling import Route
from pytest_qwenperf.suite.config import Suite


def repeats(n: int) -> SequentialPlan:
    """A plan of ``n`` repeats and no extra one."""
    return SequentialPlan(DEFAULT_CONFIDENCE, n, n)


ONE_REPEAT = repeats(1)


@dataclass(frozen=True)
class Method:
    """How a point is measured (the defaults: one repeat, nothing pinned, the suite's defaults)."""

    suite: str = ""  # the suite's name, which the run's identity carries
    plan: SequentialPlan = ONE_REPEAT
    client: ClientSetup = field(default_factory=ClientSetup)  # where the load generator runs: its cores, its processes, a Ray cluster
    api_key: ApiKey | None = None  # the key the servers require, sent with every request
    routes: tuple[Route, ...] | None = None  # replica counts and how to reach them; None: the server's own
    tolerances: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    validity: ValidityLimits = ValidityLimits()
    must_match: tuple[str, ...] = ()
    baseline_max_age_days: int | None = None  # the suite's: a stored baseline older than this is named stale
    profile: ProfileSetting | None = None  # where a point's operator profile goes (one extra, unmeasured repeat); None: not profiled

    @classmethod
    def of(
        cls,
        suite: Suite,
        plan: SequentialPlan,
        client: ClientSetup,
        *,
        api_key: ApiKey | None = None,
        routes: Sequence[Route] | None = None,
        profile: ProfileSetting | None = None,
    ) -> Method:
        """How a point of ``suite`` is measured: its tolerances, validity limits and must-match fields,
        and what the caller decides (the plan, the client's cores and workers and where they run, the key, the routes, the profile)."""
        return cls(
            suite=suite.name,
            plan=plan,
            client=client,
            api_key=api_key,
            routes=tuple(routes) if routes is not None else None,
            tolerances=MappingProxyType(dict(suite.tolerances)),
            validity=suite.validity,
            must_match=tuple(suite.must_match),
            baseline_max_age_days=suite.baseline_max_age_days,
            profile=profile,
        )
