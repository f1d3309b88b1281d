"""The two SLO policies: Flotilla's SLO scaler, and llm-d's published SLO-aware rule.

`SloController` calls the operator's own `decide_slo` (flotilla_operator.slo_scaler) once per model per
autoscaler tick, on the percentiles the simulated Prometheus holds (latency.py); with `queue` it also calls
`decide` and keeps the larger answer through the operator's `combine`, as handlers/autoscale.py does for a
model with both. Nothing of the rule is written here.

`LlmdController` is llm-d's SLO-aware KEDA recipe, not ours, so it is written here as its control-law
document states it (llm-d, docs/architecture/autoscaling/slo-aware-keda.md):
- s_raw = max(P90 TTFT / S_ttft, P90 TPOT / S_tpot) over 1-minute bucket rates, recorded every 15 s; no
  traffic reads 0; s = the 45 s average of min(s_raw, 2.0);
- d = n + ceil(n (s c / 0.55 - 1)) above 0.55, with the credit c = r / n (0 < r < n, else 1);
  d = n - floor(n (1 - s / 0.40)) below 0.40; n in between;
- the HPA KEDA drives: its 10 % tolerance, scale-up by at most max(100 %, 4 pods) per 60 s with a 30 s
  stabilization window (lowest recommendation), scale-down by 1 pod per 120 s with a 180 s window (highest).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from flotilla_operator.autoscaler import AutoscalerState, Observation, PoolMetrics, ScalingSpec, decide
from flotilla_operator.slo_scaler import (
    LatencySample,
    SloObservation,
    SloState,
    SloTargets,
    combine,
    decide_slo,
)

from flotilla_sim.policies import MAX_REPLICAS, Metrics

# The SLO both policies hold unless told otherwise (flotilla-sim --slo-ttft-s, --slo-tpot-s, --slo-percentile):
# TTFT <= 1 s, the headline SLO of docs/simulation.md's tables, and TPOT <= 100 ms, llm-d's example, at p90
# (the CRD's default and llm-d's), over one minute (the CRD's default window and llm-d's bucket rates).
DEFAULT_SLO = SloTargets(ttft_s=1.0, tpot_s=0.1, ttft_percentile=0.9, tpot_percentile=0.9, window_s=60.0)

LLMD_PERCENTILE = 0.9
LLMD_WINDOW_S = 60.0  # the recording rules' bucket rates
LLMD_RECORD_EVERY_S = 15.0
LLMD_SMOOTH_S = 45.0
LLMD_CAP = 2.0
LLMD_UP, LLMD_DOWN = 0.55, 0.40
HPA_TOLERANCE = 0.10
HPA_UP_PERIOD_S, HPA_UP_WINDOW_S = 60.0, 30.0
HPA_DOWN_PERIOD_S, HPA_DOWN_WINDOW_S = 120.0, 180.0


class SloController:
    """Flotilla's SLO scaler per model (`queue`: beside the queue-depth rule, the larger answer winning)."""

    needs_latency = True

    def __init__(self, spec: ScalingSpec, slo: SloTargets, num_models: int, slots: int, queue: bool = False,
                 wakes: bool = False) -> None:
        self.spec, self.slo, self.slots, self.queue, self.wakes = spec, slo, slots, queue, wakes
        self.window_s = slo.window_s
        self.states = [SloState() for _ in range(num_models)]
        self.queue_states = [AutoscalerState() for _ in range(num_models)]
        self.reasons: list[str] = [""] * num_models

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        view = m.latency
        assert view is not None, "the SLO scaler needs the simulated Prometheus' latency (Metrics.latency)"
        requests = view.requests.tolist()
        ttft = view.ttft_s(self.slo.ttft_percentile).tolist() if self.slo.ttft_s is not None else [math.nan] * len(requests)
        tpot = view.tpot_s(self.slo.tpot_percentile).tolist() if self.slo.tpot_s is not None else [math.nan] * len(requests)
        reporting = (m.ready if m.reporting is None else m.reporting).tolist()
        rows = zip(m.running.tolist(), m.waiting.tolist(), m.held.tolist(), m.replicas.tolist(), m.ready.tolist(),
                   m.woken_at_s.tolist(), reporting, requests, ttft, tpot, strict=True)
        desired = []
        for i, (running, waiting, held, replicas, ready, woken, seen, asked, first, gap) in enumerate(rows):
            load = PoolMetrics(waiting, running, self.slots, seen)
            latency = LatencySample(asked, None if first != first else first, None if gap != gap else gap)  # NaN: none
            slo = decide_slo(self.spec, self.slo, SloObservation(latency, load, replicas, ready, replicas - ready, now_s),
                             self.states[i])
            self.states[i] = slo.state
            want, reason = slo.desired_replicas, slo.reason
            if self.queue:
                obs = Observation(load, replicas, ready, replicas - ready, now_s, pending_demand=math.ceil(held),
                                  woken_at_s=None if woken != woken else woken)
                queue = decide(self.spec, obs, self.queue_states[i])
                self.queue_states[i] = queue.state
                want, reason, _ = combine(queue, slo)
            self.reasons[i] = reason
            desired.append(want)
        return np.array(desired, dtype=np.int64)


class LlmdController:
    """llm-d's SLO-aware rule and the HPA behind it, vectorised over models (module docstring)."""

    needs_latency = True
    window_s = LLMD_WINDOW_S

    def __init__(self, slo: SloTargets, num_models: int, min_replicas: int = 1) -> None:
        self.slo, self.min_replicas, self.wakes = slo, min_replicas, False
        self.records: deque[tuple[float, np.ndarray]] = deque()  # (time, s_raw) of the recording rule
        self.last_record_s = -math.inf
        self.history: deque[tuple[float, np.ndarray]] = deque()  # (time, HPA recommendation)
        self.last_up_s = np.full(num_models, -math.inf)
        self.last_down_s = np.full(num_models, -math.inf)

    def s_raw(self, m: Metrics) -> np.ndarray:
        ratios = []
        for target, quantile in ((self.slo.ttft_s, m.latency.ttft_s), (self.slo.tpot_s, m.latency.tpot_s)):
            if target is not None:
                ratios.append(np.nan_to_num(quantile(LLMD_PERCENTILE) / target, nan=0.0))  # no traffic: 0
        return np.maximum.reduce(ratios)

    def record(self, now_s: float, m: Metrics) -> None:
        """The recording rule, every 15 s: min(s_raw, C), kept for the 45 s average."""
        if now_s - self.last_record_s < LLMD_RECORD_EVERY_S - 1e-9:
            return
        self.last_record_s = now_s
        self.records.append((now_s, np.minimum(self.s_raw(m), LLMD_CAP)))
        while self.records and self.records[0][0] <= now_s - LLMD_SMOOTH_S:
            self.records.popleft()

    def decide(self, now_s: float, m: Metrics) -> np.ndarray:
        self.record(now_s, m)
        s = np.mean([values for _, values in self.records], axis=0)
        n = m.replicas.astype(np.float64)
        r = m.ready.astype(np.float64)
        credit = np.where((r > 0) & (r < n), r / np.maximum(n, 1e-12), 1.0)
        up = n + np.ceil(n * (s * credit / LLMD_UP - 1) - 1e-9)
        down = n - np.floor(n * (1 - s / LLMD_DOWN) + 1e-9)
        d = np.where(s > LLMD_UP, up, np.where(s < LLMD_DOWN, down, n))
        d = np.clip(d, self.min_replicas, MAX_REPLICAS)
        within = (n > 0) & (np.abs(d / np.maximum(n, 1e-12) - 1.0) <= HPA_TOLERANCE)
        want = np.where(within, n, d).astype(np.int64)
        self.history.append((now_s, want))
        while self.history and self.history[0][0] < now_s - max(HPA_UP_WINDOW_S, HPA_DOWN_WINDOW_S):
            self.history.popleft()
        return self._hpa(now_s, n.astype(np.int64), want)

    def _hpa(self, now_s: float, n: np.ndarray, want: np.ndarray) -> np.ndarray:
        """The HPA's behaviour block: stabilization windows, then the rate limits per period."""
        up_window = np.min([w for t, w in self.history if t >= now_s - HPA_UP_WINDOW_S], axis=0)
        down_window = np.max([w for t, w in self.history if t >= now_s - HPA_DOWN_WINDOW_S], axis=0)
        may_up = now_s - self.last_up_s >= HPA_UP_PERIOD_S - 1e-9
        may_down = now_s - self.last_down_s >= HPA_DOWN_PERIOD_S - 1e-9
        up_to = np.minimum(up_window, n + np.maximum(n, 4))
        rising = (want > n) & (up_to > n) & may_up
        falling = (want < n) & (down_window < n) & may_down
        out = np.where(rising, up_to, np.where(falling, n - 1, n))
        self.last_up_s = np.where(rising, now_s, self.last_up_s)
        self.last_down_s = np.where(falling, now_s, self.last_down_s)
        return out.astype(np.int64)
