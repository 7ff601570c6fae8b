"""One measured point: a workload driven against a running config, and everything it showed.

Plain Python over the other modules: the plugin, the CLI and a notebook all call
:func:`measure`, and the :class:`~pytest_qwenperf.core.run.Run` it returns is what the
verdicts, the JSON report and pytest-benchmark get.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import msgspec

from pytest_qwenperf.core.apikey import ApiKey, redact_argv
from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.http import http_post
from pytest_qwenperf.core.run import ClientLoad, Run, RunContext, RunHardware, RunIdentity, ServerCounters, TokenCheck, combined
from pytest_qwenperf.core.summary import (
    GoodputSLO,
    RunSummary,
    TokenCrossCheck,
    client_bound_reason,
    cross_check,
    steady_window,
    summarize,
    summarize_window,
)
from pytest_qwenperf.core.validity import ValidityLimits
from pytest_qwenperf.loadgen.arrivals import Arrival
from pytest_qwenperf.loadgen.client import (
    LoadOptions,
    LoadResult,
    Progress,
    run_load_sync,
)
from pytest_qwenperf.loadgen.request import RequestSpec
from pytest_qwenperf.loadgen.tokenizer import PromptTokenizer
from pytest_qwenperf.loadgen.workers import pin_current_process, run_load_in_workers
from pytest_qwenperf.measure.scaling import (
    SCALING_THROUGHPUT,
    Route,
    ScalingSummary,
    copies_of,
    times_arrival,
)
from pytest_qwenperf.measure.validity import conditions
from pytest_qwenperf.serving.hardware import Hardware, detect
from pytest_qwenperf.serving.server import Server, ServerError, ServerInfo
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.config import ServingConfig, SuiteWorkload
from pytest_qwenperf.telemetry import Telemetry, TelemetrySummary
from pytest_qwenperf.telemetry.server_metrics import (
    COUNTERS,
    MetricsSnapshot,
    MetricsUnreadable,
    combine,
    counter_deltas,
    scrape_each,
)


def build_run(
    *,
    suite: str,
    config: ServingConfig,
    workload: SuiteWorkload,
    servers: Sequence[ServerInfo],
    hardware: Hardware,
    summary: RunSummary,
    steady: RunSummary | None,
    server_deltas: Mapping[str, float | None],
    requests_per_server: Mapping[str, float | None],  # base URL -> requests it finished (its /metrics)
    tokens: TokenCrossCheck,
    client_bound: str | None,
    client_cpu_busy: float,  # fraction of the run the client process spent on a CPU
    client_cpus: Sequence[int],
    started: str,  # ISO 8601, UTC
    telemetry: TelemetrySummary,
    tolerances: Mapping[str, float] = MappingProxyType({}),  # the suite's, per gated metric
    validity: ValidityLimits = ValidityLimits(),  # the suite's
) -> Run:
    """The record of one load run: identity (what was measured), context (where, which
    versions) and results, kept apart; the conditions its telemetry shows were wrong."""
    return Run(
        identity=RunIdentity(
            suite=suite,
            config=config.id,
            argv=tuple(redact_argv(config.vllm_args)),
            model=config.model,
            workload=workload.id,
            workload_fingerprint=workload.workload.fingerprint(),
            hardware=hardware.id,
        ),
        context=RunContext(
            vllm_version=servers[0].version if servers else None,
            hardware=msgspec.convert(hardware.as_dict(), RunHardware),
            servers=tuple(info.as_dict() for info in servers),
            replicas=config.replicas,
            routing=config.routing,
            client_cpus=tuple(client_cpus),
            started=started,
            environment=_environment(servers, hardware),
        ),
        metrics=dict(summary.values()),
        steady_state=dict(steady.values()) if steady else None,
        server=ServerCounters.of(server_deltas),
        token_check=TokenCheck(matches=tokens.matches, detail=tokens.describe()),
        client=ClientLoad(bound=client_bound, cpu_busy=client_cpu_busy),
        telemetry=telemetry.as_json(),
        requests_per_server=dict(requests_per_server),
        samples={},
        tolerances=dict(tolerances),
        conditions=conditions(telemetry, validity),
    )


def _environment(servers: Sequence[ServerInfo], hardware: Hardware) -> Environment | None:
    """The first server's environment, with this machine's GPU and driver where the server did not say."""
    reported = servers[0].environment if servers else None
    if reported is None:
        return None
    return msgspec.structs.replace(
        reported,
        gpu_name=reported.gpu_name or hardware.gpu_name or None,
        gpu_count=reported.gpu_count or hardware.gpu_count or None,
        driver=reported.driver or hardware.driver_version or None,
    )


def _scalar_metrics(run: Run) -> dict[str, float]:
    """Client metrics, the server-side rates, tokens per joule and per server CPU-second: every
    figure a repeat contributes a sample of."""
    values = {name: float(value) for name, value in run.metrics.items() if value is not None}
    rates = {
        "prefix_cache_hit_rate": run.server.prefix_cache_hit_rate,
        "spec_decode_acceptance_rate": run.server.spec_decode_acceptance_rate,
        "spec_decode_mean_acceptance_length": run.server.spec_decode_mean_acceptance_length,
        "tokens_per_joule": run.value("tokens_per_joule"),
        "tokens_per_server_cpu_s": run.value("tokens_per_server_cpu_s"),
    }
    return values | {name: value for name, value in rates.items() if value is not None}


@dataclass(frozen=True)
class Observation:
    """What one load run against some endpoints saw, before it is tied to a serving config."""

    load: LoadResult
    summary: RunSummary
    steady: RunSummary | None
    server_deltas: Mapping[str, float | None]
    requests_per_server: Mapping[str, float | None]
    tokens: TokenCrossCheck
    client_bound: str | None
    client_cpu_busy: float
    started: str
    telemetry: TelemetrySummary


def observe(
    base_urls: Sequence[str],
    model: str,
    requests: Sequence[RequestSpec],
    arrival: Arrival,
    options: LoadOptions = LoadOptions(),
    *,
    slo: GoodputSLO | None = None,
    client_cpus: frozenset[int] = frozenset(),
    workers: int = 1,
    progress: Progress | None = None,
    server_pids: Sequence[int] = (),
    gpu_visible_devices: Sequence[str | None] = (),
    sample: bool = True,
    metrics_urls: Sequence[str] | None = None,
) -> Observation:
    """Drive ``requests`` against ``base_urls`` and measure: client records, the servers'
    /metrics deltas, and telemetry sampled meanwhile (see :class:`Telemetry`).

    ``client_cpus`` pins the client (and its workers) while the load runs, so the
    instrument does not share cores with the server; the previous affinity is restored.
    ``client_cpu_busy`` is the CPU the client used per second per client process.
    ``server_pids`` / ``gpu_visible_devices``: whose CPU and which GPUs to sample;
    ``sample=False`` runs no sampler at all (what ``benchmarks/overhead.py`` compares against).
    ``metrics_urls``: the servers whose /metrics to read when requests go through a router
    (default ``base_urls``).
    """
    metrics_urls = tuple(base_urls if metrics_urls is None else metrics_urls)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    before = _counters(metrics_urls)
    previous_cpus = pin_current_process(client_cpus) if client_cpus else None
    telemetry = (
        Telemetry.start(
            gpu_visible_devices=gpu_visible_devices, server_pids=server_pids, client_pid=os.getpid(), metrics_urls=metrics_urls
        )
        if sample
        else Telemetry(gpu=None, cpu=None, server=None)
    )
    try:
        cpu_start, wall_start = _client_cpu_s(), time.perf_counter()
        if workers > 1:
            load = run_load_in_workers(workers, base_urls, model, requests, arrival, options, progress=progress)
        else:
            load = run_load_sync(base_urls, model, requests, arrival, options, progress=progress)
        busy = (_client_cpu_s() - cpu_start) / max(time.perf_counter() - wall_start, 1e-9) / workers
    finally:
        telemetry.stop()
        if previous_cpus is not None:
            pin_current_process(previous_cpus)
    after = _counters(metrics_urls)
    deltas = counter_deltas(combine(before), combine(after)) if before and after else dict.fromkeys(COUNTERS)
    per_server = (
        {url: counter_deltas(b, a)["request_success"] for url, b, a in zip(metrics_urls, before, after, strict=True)}
        if before and after
        else dict.fromkeys(metrics_urls)
    )
    window = steady_window(load.records)
    summary = summarize(load.records, goodput_slo=slo, requested_rate=load.requested_rate)
    steady = summarize_window(load.records, window) if window else None
    return Observation(
        load=load,
        summary=summary,
        steady=steady,
        server_deltas=MappingProxyType(deltas),
        requests_per_server=MappingProxyType(per_server),
        tokens=cross_check(load.records, deltas["prompt_tokens"], deltas["generation_tokens"]),
        client_bound=client_bound_reason(load.records, requested_rate=load.requested_rate, client_cpu_busy_fraction=busy),
        client_cpu_busy=busy,
        started=started,
        telemetry=telemetry.summary(window, tokens=int((steady or summary)["total_output_tokens"].value)),
    )


def _counters(urls: Sequence[str]) -> list[MetricsSnapshot] | None:
    """Each server's counters; None where /metrics is not served (a gateway, another kind of
    server) or answers with something that is not Prometheus text: the run then has no
    server-side cross-check, which its result shows (and the servers' ``unreadable``, from
    :func:`~pytest_qwenperf.serving.server.describe`, says why)."""
    try:
        return scrape_each(urls)
    except (OSError, MetricsUnreadable):
        return None


def _client_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the load generator's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


Repeat = Mapping[int, Run]
"""One repeat of a point: the load run of each route, by its replica count."""


def measure(
    server: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    *,
    suite: str = "",
    client_cpus: frozenset[int] = frozenset(),
    repeats: int = 1,
    tolerances: Mapping[str, float] = MappingProxyType({}),
    routes: Sequence[Route] | None = None,
    workers: int = 1,
    api_key: ApiKey | None = None,
    validity: ValidityLimits = ValidityLimits(),
    must_match: Sequence[str] = (),
) -> Run:
    """Drive ``workload`` against ``server`` (running ``config``) ``repeats`` times.

    The result is the repeat with the median total token throughput, carrying every
    repeat's figures in ``samples`` (what verdicts weigh the noise with). A repeat that
    was client-bound or whose token totals disagree with the server makes the result so.
    ``tolerances`` and ``must_match`` (the suite's) travel with the result, so a baseline recorded from it
    and ``qwenperf compare`` judge it as the suite says. Each load run starts with an
    empty prefix cache where the server allows a reset (see :func:`reset_prefix_caches`),
    so a run does not hit on the prompts of the one before.

    A workload is the load of one replica: ``routes`` (default :func:`routes_of` the
    server for ``config.replicas``) name replica counts and how to reach them, and each
    gets that many times the load in every repeat. The result is the run of the config's
    own replica count (else the largest); with more than one route it carries the scaling
    efficiencies (:class:`ScalingSummary`) as ``scaling_efficiency_n<N>`` samples. A server
    of ours that stops during a run raises :class:`ServerError` naming it. ``workers``:
    load-generator processes (see :func:`observe`). ``api_key``: the key the servers require
    (vLLM's ``--api-key``), sent with every request. ``validity``: the suite's limits on the
    device's conditions (:mod:`pytest_qwenperf.measure.validity`); a repeat that passed one
    makes the result invalid.

    The repeats are :func:`measure_repeat` and their result :func:`combine_repeats`, which
    a caller adding repeats as the verdicts ask (:mod:`pytest_qwenperf.measure.sequential`) uses.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    measured = [
        measure_repeat(
            server,
            config,
            workload,
            suite=suite,
            client_cpus=client_cpus,
            routes=routes,
            workers=workers,
            api_key=api_key,
            validity=validity,
        )
        for _ in range(repeats)
    ]
    return combine_repeats(measured, config.replicas, tolerances=tolerances, must_match=must_match)


def measure_repeat(
    server: Server,
    config: ServingConfig,
    workload: SuiteWorkload,
    *,
    suite: str = "",
    client_cpus: frozenset[int] = frozenset(),
    routes: Sequence[Route] | None = None,
    workers: int = 1,
    api_key: ApiKey | None = None,
    validity: ValidityLimits = ValidityLimits(),
) -> Repeat:
    """One repeat of a point: a load run on each route, fewest replicas first, each on empty
    prefix caches (the arguments are :func:`measure`'s)."""
    runs: dict[int, Run] = {}
    for route in sorted(routes or routes_of(server, config.replicas), key=lambda route: route.replicas):
        reset_prefix_caches(route.metrics_urls)
        runs[route.replicas] = _measure_once(
            server,
            route,
            config,
            workload,
            suite=suite,
            client_cpus=client_cpus,
            workers=workers,
            api_key=api_key,
            validity=validity,
        )
        server.check_alive()
    return MappingProxyType(runs)


def combine_repeats(
    repeats: Sequence[Repeat],
    replicas: int,
    *,
    tolerances: Mapping[str, float] = MappingProxyType({}),
    must_match: Sequence[str] = (),
) -> Run:
    """The run of a point measured as ``repeats`` (as :func:`measure` describes it): the median
    repeat of the ``replicas`` route (else the largest), every repeat's figures as its samples;
    it carries the suite's ``tolerances`` and ``must_match`` (what a comparison of it holds to)."""
    if not repeats:
        raise ValueError("a run needs at least one repeat")
    counts = sorted(repeats[0])
    runs = {n: [repeat[n] for repeat in repeats] for n in counts}
    own = runs.get(replicas) or runs[counts[-1]]
    ranked = sorted(own, key=lambda run: _throughput(run, "total_token_throughput"))
    chosen = ranked[(len(ranked) - 1) // 2]
    per_run = [_scalar_metrics(run) for run in own]
    samples: dict[str, tuple[float | None, ...]] = {
        name: tuple(values[name] for values in per_run) for name in per_run[0] if all(name in v for v in per_run)
    }
    scaling = None
    if len(counts) > 1:
        throughput = {n: [_throughput(run, SCALING_THROUGHPUT) for run in measured] for n, measured in runs.items()}
        scaling = ScalingSummary.of(throughput, chosen.requests_per_server)
        samples |= scaling.samples()
    every = [run for measured in runs.values() for run in measured]
    whole = combined(every, chosen, samples, "load runs")
    return msgspec.structs.replace(
        whole, tolerances=dict(tolerances), must_match=tuple(must_match), scaling=scaling.record() if scaling else None
    )


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


def _measure_once(
    server: Server,
    route: Route,
    config: ServingConfig,
    workload: SuiteWorkload,
    *,
    suite: str,
    client_cpus: frozenset[int],
    workers: int,
    api_key: ApiKey | None,
    validity: ValidityLimits,
) -> Run:
    hardware = detect()
    tokenizer = PromptTokenizer.load(embedded.resolve_model(config.model))
    n = route.replicas
    seen = observe(
        route.load_urls,
        server.model,
        copies_of(workload.workload, n, tokenizer),
        times_arrival(workload.arrival, n),
        # Usage in every chunk costs the server CPU per chunk (~20 % on the 2-core CPU build),
        # but without it a chunk whose text is empty (a partial UTF-8 byte token) cannot be
        # timed, and speculative chunks carry several tokens: exact timing needs it.
        LoadOptions(warmup=workload.warmup * n, routing=_client_routing(config.routing), api_key=api_key),
        slo=workload.slo,
        client_cpus=client_cpus,
        workers=workers,
        server_pids=server.pids,
        gpu_visible_devices=_gpu_devices(config, hardware),
        metrics_urls=route.metrics_urls,
    )
    return build_run(
        suite=suite,
        config=config,
        workload=workload,
        servers=server.info,
        hardware=hardware,
        summary=seen.summary,
        steady=seen.steady,
        server_deltas=seen.server_deltas,
        requests_per_server=seen.requests_per_server,
        tokens=seen.tokens,
        client_bound=seen.client_bound,
        client_cpu_busy=seen.client_cpu_busy,
        client_cpus=seen.load.client_cpus[0],
        started=seen.started,
        telemetry=seen.telemetry,
        validity=validity,
    )


def _client_routing(routing: str) -> str:
    """The load generator's own routing; behind nginx it sends everything to the one router URL."""
    return "round-robin" if routing == "nginx" else routing


def _gpu_devices(config: ServingConfig, hardware: Hardware) -> tuple[str | None, ...]:
    """The GPUs the config's server sees (its CUDA_VISIBLE_DEVICES, else all); none on CPU hosts."""
    if hardware.kind == "cpu":
        return ()
    return (dict(config.env).get("CUDA_VISIBLE_DEVICES"),)
