"""Scenarios: build a workload, size the fleet, and run the policies side by side.

Sizing rule (docs/simulation.md, "Fleet day"): the rate is scaled so that static provisioning at peak
needs exactly the fleet's GPUs; every other policy is then judged on the same arrivals.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import numpy as np
from flotilla_operator.autoscaler import LATENCY_FIRST, ScalingSpec
from flotilla_operator.slo_scaler import SloTargets

from flotilla_sim import fluid, policies
from flotilla_sim.adaptive import AdaptiveController
from flotilla_sim.drift import DriftSpec, drifting_day
from flotilla_sim.pool import PoolController
from flotilla_sim.progress import Progress
from flotilla_sim.server_model import ServerProfile, service_s
from flotilla_sim.slo_policies import DEFAULT_SLO, LlmdController, SloController
from flotilla_sim.workload import Binned, Trace, expected_day, fleet_day

PEAK_WINDOW_S = 60.0  # static provisioning plans for the peak of each model's 1-minute mean rate


def peak_in_flight(work: Binned, profile: ServerProfile) -> np.ndarray:
    """Each model's peak in-flight requests at latency-first's batch: peak 1-minute rate x service time."""
    width = max(round(PEAK_WINDOW_S / work.tick_s), 1)
    kernel = np.ones(width) / (width * work.tick_s)
    ticks, start = work.arrivals.shape[0], (width - 1) // 2
    # the window centred on each tick, zero outside the trace: mode="same", also for a trace shorter than it
    rate = np.apply_along_axis(lambda col: np.convolve(col, kernel)[start:start + ticks], 0, work.arrivals)
    hold = service_s(profile, policies.STATIC_HEADROOM * profile.slots, work.prompt_tokens, work.output_tokens)
    return np.max(rate * hold[:, None], axis=0)


def rate_scale_for(base: Trace, num_models: int, fleet_gpus: int, tick_s: float, profile: ServerProfile) -> float:
    """The rate multiplier at which static provisioning at peak needs `fleet_gpus` (bisection)."""
    peak = peak_in_flight(expected_day(base, num_models, tick_s), profile)
    low, high = 0.0, 1.0
    while policies.static_replicas(peak * high, profile.slots).sum() < fleet_gpus:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        if policies.static_replicas(peak * mid, profile.slots).sum() < fleet_gpus:
            low = mid
        else:
            high = mid
    return high


def controller_for(policy: str, work: Binned, profile: ServerProfile, interval_s: float,
                   slo: SloTargets = DEFAULT_SLO):
    """The controller of `policy` and the replicas each model starts the run with (ready)."""
    models = work.arrivals.shape[1]
    if policy == policies.SLO:  # a latency-first InferenceModel with spec.slo, scaled by its SLO alone
        spec = ScalingSpec(1, policies.MAX_REPLICAS, LATENCY_FIRST)
        return SloController(spec, slo, models, profile.slots), np.ones(models)
    if policy == policies.ADAPTIVE:
        return AdaptiveController(models, profile, work.tick_s, slo), np.zeros(models)
    if policy == policies.LLMD:
        return LlmdController(slo, models), np.ones(models)
    if policy == policies.LATENCY:
        spec = policies.operator_spec(policy)
        return policies.OperatorController(spec, models, profile.slots, wakes=False), np.ones(models)
    if policy == policies.COST_ZERO:
        spec = policies.operator_spec(policy)
        return policies.OperatorController(spec, models, profile.slots, wakes=True), np.zeros(models)
    if policy == policies.COST_POOL:
        return PoolController(models, profile, work.tick_s), np.zeros(models)
    if policy == policies.KUBEAI:
        return policies.KubeAIController(models, profile.slots, interval_s), np.zeros(models)
    if policy == policies.KEDA:
        return policies.KedaController(models, interval_s), np.ones(models)
    if policy == policies.STATIC:
        replicas = policies.static_replicas(peak_in_flight(work, profile), profile.slots)
        return policies.StaticController(replicas), replicas
    raise ValueError(f"unknown policy {policy!r}; one of {', '.join(policies.ALL)}")


@dataclass(frozen=True)
class Scenario:
    name: str
    work: Binned
    profile: ServerProfile
    interval_s: float
    notes: dict
    slo: SloTargets = DEFAULT_SLO  # what the SLO policies hold


def run_one(scenario: Scenario, name: str, progress: Progress | None = None) -> dict:
    started = time.monotonic()
    controller, initial = controller_for(name, scenario.work, scenario.profile, scenario.interval_s, scenario.slo)
    config = fluid.FluidConfig(interval_s=scenario.interval_s)
    result = fluid.run(scenario.work, scenario.profile, controller, initial, policies.node_pool(name), config, progress)
    if hasattr(controller, "report"):  # adaptive: its moves
        result["tiering"] = controller.report(scenario.work.arrivals.shape[0] * scenario.work.tick_s)
    result["wall_s"] = time.monotonic() - started
    return result


def run_policies(scenario: Scenario, names: tuple[str, ...] = policies.ALL, show_progress: bool = False,
                 jobs: int = 1) -> dict:
    """Each policy on the same arrivals; with jobs > 1, policies run in that many forked processes
    (they share nothing but the read-only workload), and the bar counts policies as they finish."""
    ticks = scenario.work.arrivals.shape[0]
    if jobs <= 1:
        progress = Progress(ticks * len(names), f"{scenario.name}: {len(names)} policies", force=show_progress)
        return {name: run_one(scenario, name, progress if show_progress else None) for name in names}
    progress = Progress(len(names), f"{scenario.name}: {len(names)} policies, {jobs} processes", force=show_progress)
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs) as pool:
        pending = {name: pool.apply_async(run_one, (scenario, name), callback=lambda _: progress.advance())
                   for name in names}
        return {name: handle.get() for name, handle in pending.items()}


def fleet_scenario(base: Trace, num_models: int, fleet_gpus: int, tick_s: float, interval_s: float,
                   profile: ServerProfile, seed: int, trace_name: str, slo: SloTargets = DEFAULT_SLO,
                   drift: DriftSpec | None = None) -> Scenario:
    """The fleet day, or with `drift` the drifting day (drift.py) at the same total rate."""
    scale = rate_scale_for(base, num_models, fleet_gpus, tick_s, profile)
    rng = np.random.default_rng(seed)
    work = fleet_day(base, num_models, tick_s, scale, rng) if drift is None else \
        drifting_day(base, num_models, tick_s, scale, rng, drift)
    notes = {"trace": trace_name, "models": num_models, "fleet_gpus": fleet_gpus, "rate_scale": scale,
             "seed": seed, "tick_s": tick_s, "autoscale_interval_s": interval_s,
             "requests": float(work.arrivals.sum()), "slo": slo_notes(slo)}
    if drift is not None:
        notes["drift"] = {"drift_every_h": drift.drift_every_h, "drift_swap": drift.drift_swap,
                          "idle_share": drift.idle_share, "idle_h": drift.idle_h}
    return Scenario(f"{'fleet' if drift is None else 'drifting'}-day-{trace_name}", work, profile, interval_s, notes, slo)


def slo_notes(slo: SloTargets) -> dict:
    """The SLO the SLO policies held, as the run's JSON records it."""
    return {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "ttft_percentile": slo.ttft_percentile,
            "tpot_percentile": slo.tpot_percentile, "window_s": slo.window_s}
