"""One measured point: a workload driven against a running config, and everything it showed.

Plain Python over the other modules: the plugin, the CLI and a notebook all call
:func:`measure`, and the :class:`~pytest_qwenperf.core.run.Run` it returns is what the
verdicts, the JSON report and pytest-benchmark get.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

import msgspec

from pytest_qwenperf.core.apikey import redact_argv
from pytest_qwenperf.core.combine import combined
from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.http import http_post
from pytest_qwenperf.core.run import (
    ClientLoad,
    Loss,
    Run,
    RunContext,
    RunIdentity,
    ServerCounters,
    TokenCheck,
    TraceReplay,
)
from pytest_qwenperf.core.summary import latency_quantiles
from pytest_qwenperf.core.validity import RETAKEN
from pytest_qwenperf.gate.diagnosis import telemetry_figures
from pytest_qwenperf.loadgen.arrivals import Replay
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.observe import Load, Observation, Target, observe
from pytest_qwenperf.measure.profile import capture
from pytest_qwenperf.measure.progress import PointProgress, load_label, watched
from pytest_qwenperf.measure.scaling import (
    SCALING_THROUGHPUT,
    Route,
    ScalingSummary,
    copies_of,
    times_arrival,
)
from pytest_qwenperf.measure.search import CAPACITY, Watch, search_once
from pytest_qwenperf.measure.validity import conditions
from pytest_qwenperf.serving.hardware import Hardware, detect
from pytest_qwenperf.serving.server import Server, ServerError, ServerInfo
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload
from pytest_qwenperf.suite.workloads import TraceWorkload, trace_replay


def build_run(
    config: ServingConfig,
    workload: SuiteWorkload,
    seen: Observation,
    method: Method,
    servers: Sequence[ServerInfo],
    hardware: Hardware,
) -> Run:
    """The record of one load run of a point as ``method`` measures it: identity (what was
    measured), context (where, which versions) and results, kept apart; the conditions its
    telemetry shows were wrong against the method's validity limits."""
    return Run(
        identity=RunIdentity(
            suite=method.suite,
            config=config.id,
            argv=tuple(redact_argv(config.vllm_args)),
            model=config.model,
            workload=workload.id,
            workload_fingerprint=workload.fingerprint(),
            hardware=hardware.id,
        ),
        context=RunContext(
            vllm_version=servers[0].version if servers else None,
            machine=hardware.machine(),
            servers=tuple(info.as_dict() for info in servers),
            replicas=config.replicas,
            routing=config.routing,
            client_cpus=seen.client_cpus,
            started=seen.started,
            environment=_environment(servers, hardware),
        ),
        metrics=dict(seen.summary.values()),
        steady_state=dict(seen.steady.values()) if seen.steady else None,
        server=ServerCounters.of(seen.server_deltas),
        token_check=TokenCheck(matches=seen.tokens.matches, detail=seen.tokens.describe()),
        client=ClientLoad(bound=seen.client_bound, cpu_busy=seen.client_cpu_busy, workers=seen.load.clocks),
        telemetry=seen.telemetry.as_json(),
        requests_per_server=dict(seen.requests_per_server),
        samples={},
        tolerances=dict(method.tolerances),
        conditions=conditions(seen.telemetry, method.validity) + seen.record_losses(),
        trace=_trace(workload, servers),
        timeline=seen.timeline,
        distributions=latency_quantiles(seen.load.records),
    )


def _trace(workload: SuiteWorkload, servers: Sequence[ServerInfo]) -> TraceReplay | None:
    """What a trace's replay is held against, in the first server's cache blocks; None for the other workloads."""
    if not isinstance(workload.workload, TraceWorkload):
        return None
    scale = workload.arrival.time_scale if isinstance(workload.arrival, Replay) else None
    return trace_replay(workload.workload, scale, servers[0].kv_block if servers else None)


def _environment(servers: Sequence[ServerInfo], hardware: Hardware) -> Environment | None:
    """The first server's environment, with this machine's GPU and driver where the server did not say."""
    reported = servers[0].environment if servers else None
    if reported is None:
        return None
    return msgspec.structs.replace(
        reported,
        gpu_name=reported.gpu_name or hardware.gpu_name or None,
        gpu_count=reported.gpu_count or hardware.gpu_count or None,
        driver=reported.driver or hardware.driver or None,
    )


def _scalar_metrics(run: Run) -> dict[str, float]:
    """Client metrics, the server-side rates, tokens per joule and per server CPU-second, and the
    telemetry a diagnosis weighs (``gate.diagnosis.telemetry_figures``): every figure a repeat
    contributes a sample of."""
    values = {name: float(value) for name, value in run.metrics.items() if value is not None}
    rates = {
        "prefix_cache_hit_rate": run.server.prefix_cache_hit_rate,
        "spec_decode_acceptance_rate": run.server.spec_decode_acceptance_rate,
        "spec_decode_mean_acceptance_length": run.server.spec_decode_mean_acceptance_length,
        "tokens_per_joule": run.value("tokens_per_joule"),
        "tokens_per_server_cpu_s": run.value("tokens_per_server_cpu_s"),
    }
    return values | telemetry_figures(run) | {name: value for name, value in rates.items() if value is not None}


Repeat = Mapping[int, Run]
"""One repeat of a point: the load run of each route, by its replica count."""


def measure(server: Server, config: ServingConfig, workload: SuiteWorkload, method: Method) -> Run:
    """Drive ``workload`` against ``server`` (running ``config``) as many times as ``method``'s plan
    first takes (no extra repeats: :mod:`pytest_qwenperf.measure.sequential` adds those).

    The result is the repeat with the median total token throughput, carrying every
    repeat's figures in ``samples`` (what verdicts weigh the noise with); whatever makes a
    repeat invalid makes the result so (:func:`~pytest_qwenperf.core.combine.combined`). The
    method's tolerances and must-match fields travel with the result. Each load run starts
    with an empty prefix cache where the server allows a reset (see :func:`reset_prefix_caches`),
    so a run does not hit on the prompts of the one before.

    A workload is the load of one replica: the method's routes (default :func:`routes_of` the
    server for ``config.replicas``) name replica counts and how to reach them, and each
    gets that many times the load in every repeat. The result is the run of the config's
    own replica count (else the largest); with more than one route it carries the scaling
    efficiencies (:class:`ScalingSummary`) as ``scaling_efficiency_n<N>`` samples. A server
    of ours that stops during a run raises :class:`ServerError` naming it. A repeat whose
    device conditions passed the method's validity limits (:mod:`pytest_qwenperf.measure.validity`)
    makes the result invalid.

    The repeats are :func:`measure_repeat` and their result :func:`combine_repeats`.
    """
    repeat = chained(lambda after: measure_repeat(server, config, workload, method, after=after))
    return combine_repeats([repeat() for _ in range(method.plan.first)], config.replicas, method)


def chained(repeat: Callable[[Repeat | None], Repeat]) -> Callable[[], Repeat]:
    """The next repeat of a point, each given the one taken before it (None for the first): the
    bracket its search starts from (:func:`measure_repeat`)."""
    taken: list[Repeat] = []

    def take() -> Repeat:
        taken.append(repeat(taken[-1] if taken else None))
        return taken[-1]

    return take


def measure_repeat(
    server: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    method: Method,
    progress: PointProgress | None = None,
    after: Repeat | None = None,
) -> Repeat:
    """One repeat of a point: a load run on each route, fewest replicas first, each on empty
    prefix caches (see :func:`measure`); ``progress`` is told of each load run and its requests.
    A search workload's repeat is a search on each route, which starts where the same route's
    search of ``after`` (the point's repeat before, on the same server) settled."""
    runs: dict[int, Run] = {}
    for route in sorted(method.routes or routes_of(server, config.replicas), key=lambda route: route.replicas):
        driver = Driver(server, route, config, method, progress)
        if workload.search is None:
            runs[route.replicas] = driver.run(workload)
            continue
        before = None if after is None else after.get(route.replicas)
        runs[route.replicas] = search_once(driver.run, workload, before.capacity[0] if before and before.capacity else None)
    return MappingProxyType(runs)


def combine_repeats(repeats: Sequence[Repeat], replicas: int, method: Method) -> Run:
    """The run of a point measured as ``repeats`` (as :func:`measure` describes it): the median
    repeat of the ``replicas`` route (else the largest), every repeat's figures as its samples;
    it carries the method's tolerances and must-match fields (what a comparison of it holds to)."""
    if not repeats:
        raise ValueError("a run needs at least one repeat")
    counts = sorted(repeats[0])
    runs = {n: [repeat[n] for repeat in repeats] for n in counts}
    own = runs.get(replicas) or runs[counts[-1]]
    ranked = sorted(own, key=lambda run: _throughput(run, CAPACITY if run.capacity else "total_token_throughput"))
    chosen = ranked[(len(ranked) - 1) // 2]
    per_run = [_scalar_metrics(run) for run in own]
    # A figure one repeat lacks is a null among the samples (lost data the verdicts see), not dropped.
    names = dict.fromkeys(name for values in per_run for name in values)
    samples: dict[str, tuple[float | None, ...]] = {name: tuple(values.get(name) for values in per_run) for name in names}
    scaling = None
    if len(counts) > 1:
        throughput = {n: [_throughput(run, SCALING_THROUGHPUT) for run in measured] for n, measured in runs.items()}
        scaling = ScalingSummary.of(throughput, chosen.requests_per_server)
        samples |= scaling.samples()
    every = [run for measured in runs.values() for run in measured]
    whole = combined(every, chosen, samples, "load runs")
    return msgspec.structs.replace(
        whole,
        tolerances=dict(method.tolerances),
        must_match=method.must_match,
        baseline_max_age_days=method.baseline_max_age_days,
        scaling=scaling.record() if scaling else None,
        capacity=tuple(search for run in own for search in run.capacity),
    )


def retakeable(run: Run) -> bool:
    """Whether ``run`` was spoiled, and only by conditions the machine's other load causes."""
    return bool(run.conditions) and all(loss.reason in RETAKEN for loss in run.conditions)


def _throughput(run: Run, name: str) -> float:
    """A throughput of a run just measured: the summary always has it."""
    return float(run.metrics[name] or 0.0)


def routes_of(server: Server, replicas: int) -> tuple[Route, ...]:
    """One server: the load goes where the server says. N replicas: the first one alone
    (the reference, no router in between) and all N as the config routes to them."""
    if replicas == 1:
        return (Route(1, server.load_urls, server.base_urls),)
    if len(server.base_urls) != replicas:
        raise ServerError(
            f"a config of {replicas} replicas needs {replicas} server URLs to compare them with one; got {list(server.base_urls)}"
        )
    first = server.base_urls[:1]
    return (Route(1, first, first), Route(replicas, server.load_urls, server.base_urls))


def reset_prefix_caches(base_urls: Sequence[str]) -> bool:
    """Empty every server's prefix cache (``POST /reset_prefix_cache``); True if all did.

    vLLM serves the endpoint in dev mode only (``VLLM_SERVER_DEV_MODE=1``, which servers
    started by this package have); elsewhere (404, an unreachable gateway) nothing is reset.
    """
    done = True
    for url in base_urls:
        try:
            status, body = http_post(f"{url.rstrip('/')}/reset_prefix_cache")
        except OSError:
            status, body = None, b""
        done = done and status == 200 and _reset_succeeded(body)
    return done


def _reset_succeeded(body: bytes) -> bool:
    """vLLM answers ``{"success": false}`` while blocks are still held; older releases send no body."""
    try:
        answer = json.loads(body)
    except ValueError:
        return True
    return not isinstance(answer, dict) or answer.get("success") is not False


@dataclass(frozen=True)
class Driver:
    """What every load run on one route of a point shares: the server and the route to it, the
    config it runs, how the point is measured, and who is told of each load run and its requests."""

    server: Server
    route: Route
    config: ServingConfig
    method: Method
    progress: PointProgress | None = None

    def run(self, workload: SuiteWorkload, watch: Watch | None = None) -> Run:
        """One load run of ``workload`` on empty prefix caches, the server checked after it;
        ``watch`` (a search's probe) sees its records as they finish and may end its sending early.

        A load run spoiled only by the machine's other load (:data:`~pytest_qwenperf.core.validity.RETAKEN`)
        is measured again, up to the suite's ``[suite.validity] retakes``; the run kept carries the conditions of
        those it replaced (``Run.retaken``), and the last one stays invalid if it was spoiled too."""
        spoiled: list[Loss] = []
        while True:
            reset_prefix_caches(self.route.metrics_urls)
            run = self._observed(workload, watch)
            self.server.check_alive()
            if len(spoiled) >= self.method.validity.retakes or not retakeable(run):
                return msgspec.structs.replace(run, retaken=tuple(spoiled)) if spoiled else run
            spoiled += run.conditions
            if self.progress is not None:
                self.progress.load_retaken(", ".join(loss.reason for loss in run.conditions))

    def _observed(self, workload: SuiteWorkload, watch: Watch | None) -> Run:
        server, route, config, method = self.server, self.route, self.config, self.method
        hardware = detect()
        n = route.replicas
        # Usage in every chunk costs the server CPU per chunk (~20 % on the 2-core CPU build), but
        # without it a chunk whose text is empty (a partial UTF-8 byte token) cannot be timed, and
        # speculative chunks carry several tokens: exact timing needs it (the client always asks).
        options = LoadOptions(
            warmup=workload.warmup * n, window=workload.window, routing=_client_routing(config.routing), api_key=method.api_key
        )
        load = Load(copies_of(workload.workload, n, _tokenizer(config.model)), times_arrival(workload.arrival, n), options, workload.slo)
        if self.progress is not None:
            label = load_label(n if config.replicas > 1 else None, workload.arrival if watch else None)
            self.progress.load_started(0 if workload.window else len(load.requests), label)  # a window's requests are a supply
        seen = observe(
            Target(
                tuple(route.load_urls),
                server.model,
                metrics_urls=tuple(route.metrics_urls),
                server_pids=tuple(server.pids),
                gpu_visible_devices=_gpu_devices(config, hardware),
            ),
            load,
            method.client,
            watched(watch.start(load) if watch else None, self.progress),
        )
        return build_run(config, workload, seen, method, server.info, hardware)


@cache
def _tokenizer(model: str) -> PromptTokenizer:
    """The tokenizer prompts for ``model`` are built with, read once a session (a search's probes,
    repeats and points of one model share it)."""
    return PromptTokenizer.load(embedded.resolve_model(model))


def _client_routing(routing: str) -> str:
    """The load generator's own routing; behind nginx it sends everything to the one router URL."""
    return "round-robin" if routing == "nginx" else routing


def _gpu_devices(config: ServingConfig, hardware: Hardware) -> tuple[str | None, ...]:
    """The GPUs the config's server sees (its CUDA_VISIBLE_DEVICES, else all); none on CPU hosts."""
    if hardware.kind == "cpu":
        return ()
    return (dict(config.env).get("CUDA_VISIBLE_DEVICES"),)


def profiled(run: Run, server: Server, config: ServingConfig, workload: SuiteWorkload, method: Method) -> Run:
    """``run`` with its point's operator profile where the method asks for one: one more load run of the
    workload (its own load, a search's too) on the config's own route, after the measured repeats,
    between ``/start_profile`` and ``/stop_profile`` (:func:`~pytest_qwenperf.measure.profile.capture`);
    its figures are kept nowhere, and the profiler is off again before this returns."""
    if method.profile is None:
        return run
    routes = method.routes or routes_of(server, config.replicas)
    route = next((r for r in routes if r.replicas == config.replicas), max(routes, key=lambda r: r.replicas))

    def drive() -> None:
        Driver(server, route, config, method).run(workload)

    folder = method.profile.point(config.key, workload.id)
    found = capture(route.metrics_urls, drive, folder, relative_to=method.profile.relative_to, api_key=method.api_key)
    return msgspec.structs.replace(run, profile=found)
