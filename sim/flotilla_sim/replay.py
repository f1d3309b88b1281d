"""Replaying an e2e scenario at request level: the real loop's load and settings, its measured delays.

Why: the simulator is only worth its answers if it decides as the real loop does. The e2e tests
(e2e/test_scale_cycle.py, e2e/test_scale_to_zero.py) record their run's autoscaler ticks and the
replicas after each, measure the pod start-up delay, the scrape lag and the mean engine step, and call
`replay` with them and the InferenceModel's own spec; `agreement.compare` then checks the two
timelines tick by tick (docs/simulation.md, "Agreement with the real loop").

The load is e2e/load.py's closed loop: `clients` workers each send one request of `max_tokens` output
tokens to a random ready replica (the load generator plays a Service, not the gateway), send the next
as soon as it is answered, pause min(Retry-After, 1 s) after a 429, and send nothing after `stop_s`.
The autoscaler ticks when the real operator did (its kopf timer drifts by each decision's duration),
and sees what Prometheus held `scrape_lag_s` before each tick; with `slo` (the model's spec.slo), the
operator's SLO scaler decides beside the queue-depth rule on the latency histograms of that moment. The server model is the run's own: a flat
engine step that follows the run's measured mean step over time (on a shared CPU it changes several-fold
while new replicas import torch beside the busy one).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

import numpy as np
from flotilla_operator.autoscaler import ScalingSpec
from flotilla_operator.slo_scaler import SloTargets

from flotilla_sim.policies import OperatorController
from flotilla_sim.request_level import ARRIVAL, STEP_DONE, Replica, RequestSim
from flotilla_sim.server_model import ServerProfile
from flotilla_sim.slo_policies import SloController

RETRY_PAUSE_CAP_S = 1.0  # e2e/load.py: a 429 pauses its worker for Retry-After, at most 1 s
PROMPT_TOKENS = 12  # e2e/load.py's prompt, about a dozen tokens; a flat step makes its length moot


@dataclass(frozen=True)
class E2EScenario:
    """One model of an e2e run, as the simulator replays it. Times are seconds from the replay's start."""

    spec: ScalingSpec  # the InferenceModel's scaling, as the operator reads it
    slots: int  # server.maxNumSeqs
    queue_per_slot: int  # server.queueDepthPerSlot
    queue_timeout_s: float  # server.queueTimeoutSeconds
    start_up_s: float  # measured: a replica's creation to serving
    scrape_lag_s: float  # measured: a change on a server to Prometheus holding it
    steps_s: tuple[tuple[float, float], ...]  # measured: (time, the run's mean engine step from then on)
    initial_replicas: int = 1
    initial_ready_s: float = 0.0  # when the initial replicas serve (0: already serving)
    clients: int = 0
    max_tokens: int = 0
    stop_s: float = 0.0  # the load generator sends nothing after this
    seed: int = 0
    slo: SloTargets | None = None  # spec.slo: the SLO scaler decides beside the queue depth, as in the operator

    def profile(self, step_s: float) -> ServerProfile:
        return ServerProfile(
            source=f"measured in the e2e run: engine step {step_s * 1e3:.1f} ms, start-up {self.start_up_s:.1f} s",
            weight_bytes=0.0, params=0.0, slots=self.slots, queue_per_slot=self.queue_per_slot,
            queue_timeout_s=self.queue_timeout_s, step_base_s=step_s, pod_start_s=self.start_up_s)


class _Requests:
    """A trace that grows as the clients send: the request level's per-request columns, as lists."""

    def __init__(self) -> None:
        self.arrival_s: list[float] = []
        self.model: list[int] = []
        self.prompt_tokens: list[int] = []
        self.output_tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.arrival_s)


class ClosedLoopSim(RequestSim):
    """RequestSim driven by e2e/load.py's workers instead of a trace: one model, `clients` workers."""

    def __init__(self, scenario: E2EScenario) -> None:
        self.scenario = scenario
        controller = (OperatorController(scenario.spec, 1, scenario.slots, wakes=False) if scenario.slo is None else
                      SloController(scenario.spec, scenario.slo, 1, scenario.slots, queue=True))
        steps = scenario.steps_s or ((0.0, 0.0),)
        self.step_times_s = [t for t, _ in steps]
        self.profiles = [scenario.profile(step_s) for _, step_s in steps]
        super().__init__(_Requests(), self.profiles[0], controller, np.array([scenario.initial_replicas]),
                         interval_s=1.0, num_models=1, scrape_lag_s=scenario.scrape_lag_s,  # ticks: the real ones
                         initial_ready_s=scenario.initial_ready_s)
        self.first_token_s, self.finish_s = [], []  # grown with the requests
        self.rng = random.Random(scenario.seed)
        self.seen: list[tuple[float, float]] = []  # (running, waiting) each tick saw, to print beside the real ones

    def _tick(self, tick_s: float) -> None:
        running, waiting, _, _ = self.scrapes.get(tick_s, self.before_start)
        self.seen.append((float(running[0]), float(waiting[0])))
        super()._tick(tick_s)

    def start(self) -> None:
        """Every worker sends its first request at 0."""
        for _ in range(self.scenario.clients):
            self._send(0.0)

    def _send(self, at_s: float) -> None:
        if at_s > self.scenario.stop_s:
            return
        requests = self.trace
        rid = len(requests)
        requests.arrival_s.append(at_s)
        requests.model.append(0)
        requests.prompt_tokens.append(PROMPT_TOKENS)
        requests.output_tokens.append(self.scenario.max_tokens)
        self.first_token_s.append(np.nan)
        self.finish_s.append(np.nan)
        self._push(at_s, ARRIVAL, rid)

    def _step(self, pod: Replica) -> None:
        """A step at the run's step time now; a decode span ends where the measured step time changes."""
        i = max(bisect.bisect_right(self.step_times_s, self.now) - 1, 0)
        self.profile = self.profiles[i]
        super()._step(pod)
        if pod.stepping and pod.span_steps > 1 and i + 1 < len(self.step_times_s):
            fits = int((self.step_times_s[i + 1] - pod.span_start_s) / pod.span_step_s)
            if fits < pod.span_steps:
                pod.span_steps = max(fits, 1)
                pod.version += 1  # the span's first STEP_DONE goes stale
                self._push(pod.span_start_s + pod.span_steps * pod.span_step_s, STEP_DONE, (pod, pod.version))

    def _pick(self, pods: list[Replica], views, model: int, rid: int) -> Replica:
        return self.rng.choice(pods)

    def _served(self, rid: int) -> None:
        super()._served(rid)
        self._send(self.now)

    def _refused(self, rid: int, status: int) -> None:
        super()._refused(rid, status)
        self._send(self.now + RETRY_PAUSE_CAP_S)


@dataclass(frozen=True)
class Replayed:
    timeline: list[tuple[float, int]]  # (tick time, replicas after that tick)
    seen: list[tuple[float, float]]  # (running, waiting) each tick saw
    requests: dict  # served, rejected_429, ... (stats.Tally.summary)


def replay(scenario: E2EScenario, tick_times_s: list[float]) -> Replayed:
    """The simulated replicas at the real run's ticks, and what the simulated autoscaler saw."""
    sim = ClosedLoopSim(scenario)
    sim.start()
    result = sim.run(until_s=max(tick_times_s, default=0.0), tick_times_s=sorted(tick_times_s))
    return Replayed([(t, int(replicas[0])) for t, replicas in sim.ticks], sim.seen, result["requests"])
