"""The policies compared, each a controller from per-model metrics to per-model replicas.

Flotilla's three queue-depth policies call the operator's own `decide` (flotilla_operator.autoscaler) once
per model per autoscaler tick, and `render_placement` (flotilla_operator.placement) for the node pool each
runs on; nothing of theirs is re-implemented here. The peers' formulas (KubeAI, KEDA, static) are not ours
to import, so they are written here, vectorised, as their documentation states them (docs/simulation.md,
"Policies"). The shared pool's controller lives in pool.py, the two SLO policies' in slo_policies.py.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from flotilla_operator.autoscaler import (
    COST_FIRST,
    LATENCY_FIRST,
    AutoscalerState,
    Observation,
    PoolMetrics,
    ScalingSpec,
    decide,
)
from flotilla_operator.placement import SPOT_TOLERATIONS, render_placement
from flotilla_operator.types import PlacementSpec

from flotilla_sim.latency import LatencyView

LATENCY = "latency-first"
COST_ZERO = "cost-first-zero"
COST_POOL = "cost-first-pool"
KUBEAI = "kubeai"
KEDA = "keda"
STATIC = "static-peak"
SLO = "slo"  # Flotilla's SLO scaler alone (flotilla_operator.slo_scaler)
LLMD = "llm-d"  # llm-d's SLO-aware KEDA rule
ADAPTIVE = "adaptive"  # each model in the pool or dedicated, as flotilla_operator.tiering decides (adaptive.py)
ALL = (LATENCY, COST_ZERO, COST_POOL, KUBEAI, KEDA, STATIC, SLO, LLMD, ADAPTIVE)
FLUID_ONLY = (COST_POOL, ADAPTIVE)  # policies with a shared pool: the request level has none

# No ceiling that binds: a Zipf head model of a 10,000-GPU fleet needs more than the CRD's maxReplicas
# ceiling (1,000) allows, and the comparison is about the policies, not that limit (docs/simulation.md).
MAX_REPLICAS = 100_000
KUBEAI_WINDOW_S = 600.0  # KubeAI: the average of in-flight requests over 10 minutes
KUBEAI_SCALE_DOWN_DELAY_S = 30.0
KEDA_WAITING_THRESHOLD = 8.0  # waiting requests per replica (vllm:num_requests_waiting), as targetQueueDepth
HPA_SCALE_DOWN_WINDOW_S = 300.0  # KEDA hands its metric to an HPA: default scale-down stabilization
STATIC_HEADROOM = 0.75  # static provisioning at peak keeps latency-first's headroom


@dataclass(frozen=True)
class Metrics:
    """Per-model figures one autoscaler tick sees (arrays over models)."""

    running: np.ndarray
    waiting: np.ndarray
    held: np.ndarray  # requests a front door holds at zero replicas
    replicas: np.ndarray  # created pods (spec.replicas)
    ready: np.ndarray
    woken_at_s: np.ndarray  # NaN where never woken
    reporting: np.ndarray | None = None  # replicas in Prometheus (as of the scrape); None: the ready ones
    latency: LatencyView | None = None  # the servers' latency histograms over the window, for the SLO policies


def node_pool(policy: str) -> str:
    """Where the policy's pods run, read from the operator's placement: spot when it tolerates spot taints;
    adaptive's on both (its pool's and its dedicated replicas')."""
    if policy == ADAPTIVE:
        return "spot and dedicated"
    operator_policy = LATENCY_FIRST if policy in (LATENCY, STATIC, SLO) else COST_FIRST
    placement = render_placement(PlacementSpec(policy=operator_policy), {"app": "sim"}, gpus=1)
    return "spot" if any(t in placement.tolerations for t in SPOT_TOLERATIONS) else "dedicated"


class OperatorController:
    """Flotilla's autoscaler: `decide` per model, its state carried between ticks as the operator's status."""

    def __init__(self, spec: ScalingSpec, num_models: int, slots: int, wakes: bool) -> None:
        self.spec = spec
        self.slots = slots
        self.wakes = wakes
        self.states = [AutoscalerState() for _ in range(num_models)]
        self.reasons: list[str] = [""] * num_models

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        # plain Python lists: indexing numpy scalars a million times costs more than `decide` itself
        reporting = m.ready if m.reporting is None else m.reporting
        rows = zip(m.running.tolist(), m.waiting.tolist(), m.held.tolist(), m.replicas.tolist(),
                   m.ready.tolist(), m.woken_at_s.tolist(), reporting.tolist(), strict=True)
        desired = []
        for i, (running, waiting, held, replicas, ready, woken, seen) in enumerate(rows):
            obs = Observation(
                PoolMetrics(waiting, running, self.slots, seen), replicas, ready, replicas - ready, now_s,
                pending_demand=math.ceil(held), woken_at_s=None if woken != woken else woken,  # NaN: never woken
            )
            result = decide(self.spec, obs, self.states[i])
            self.states[i] = result.state
            self.reasons[i] = result.reason
            desired.append(result.desired_replicas)
        return np.array(desired, dtype=np.int64)


class KubeAIController:
    """KubeAI: ceil(10-minute average of in-flight requests / target), scale down after a 30 s delay."""

    def __init__(self, num_models: int, slots: int, interval_s: float) -> None:
        self.target = float(slots)
        self.wakes = True  # KubeAI's proxy scales a model from zero on its first request
        self.window: deque[np.ndarray] = deque(maxlen=max(int(KUBEAI_WINDOW_S / interval_s), 1))
        self.below_since_s = np.full(num_models, np.nan)

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        self.window.append(m.running + m.waiting + m.held)
        want = np.ceil(np.mean(self.window, axis=0) / self.target - 1e-9).astype(np.int64)
        want = np.minimum(want, MAX_REPLICAS)
        lower = want < m.replicas
        self.below_since_s = np.where(lower, np.where(np.isnan(self.below_since_s), now_s, self.below_since_s), np.nan)
        may_drop = lower & (now_s - np.nan_to_num(self.below_since_s, nan=now_s) >= KUBEAI_SCALE_DOWN_DELAY_S)
        return np.where(want > m.replicas, want, np.where(may_drop, want, m.replicas))


class KedaController:
    """KEDA on vllm:num_requests_waiting through an HPA: ceil(waiting / threshold), min 1, the HPA's
    10% tolerance and 300 s scale-down stabilization."""

    def __init__(self, num_models: int, interval_s: float) -> None:
        self.wakes = False
        self.history: deque[np.ndarray] = deque(maxlen=max(int(HPA_SCALE_DOWN_WINDOW_S / interval_s), 1))

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        raw = np.ceil(m.waiting / KEDA_WAITING_THRESHOLD - 1e-9).astype(np.int64)
        ratio = m.waiting / np.maximum(m.replicas * KEDA_WAITING_THRESHOLD, 1e-9)
        within = (m.replicas > 0) & (np.abs(ratio - 1.0) <= 0.10)
        want = np.clip(np.where(within, m.replicas, raw), 1, MAX_REPLICAS)
        self.history.append(want)
        stabilized = np.max(self.history, axis=0)
        return np.where(want > m.replicas, want, np.minimum(stabilized, m.replicas))


class StaticController:
    """Static provisioning at peak: each model's replicas fixed from its own peak demand."""

    def __init__(self, replicas: np.ndarray) -> None:
        self.replicas = replicas.astype(np.int64)
        self.wakes = False

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        return self.replicas


def static_replicas(peak_in_flight: np.ndarray, slots: int) -> np.ndarray:
    """Replicas that carry each model's peak in-flight requests at latency-first's headroom."""
    return np.maximum(np.ceil(peak_in_flight / (STATIC_HEADROOM * slots) - 1e-9), 1).astype(np.int64)


def operator_spec(policy: str) -> ScalingSpec:
    """The InferenceModel each Flotilla policy stands for: CRD defaults, max at the CRD ceiling."""
    if policy == LATENCY:
        return ScalingSpec(1, MAX_REPLICAS, LATENCY_FIRST)
    return ScalingSpec(0, MAX_REPLICAS, COST_FIRST)
