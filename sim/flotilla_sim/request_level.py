"""The request-level fidelity: discrete events per request and per engine step, for up to ~20 models.

Why a second fidelity: the fluid mode averages within a tick; this one follows every request through
the gateway's routing choice (`choose`, flotilla_gateway.routing), a replica's admission queue and its
engine steps, so it checks the fluid mode where both can run (docs/simulation.md, "Agreement").

Rules (each the real component's, simplified where docs/simulation.md says so):
- a model with no ready replica holds requests at the front door (HOLD_CAPACITY, then 429; MAX_WAIT_S,
  then 503) and, for a policy with a front door, is woken 0 -> 1 at once (a cold start);
- otherwise `choose(pods, key, "least-load")` picks the replica; a full admission queue answers 429,
  and a request still queued when its queue timeout runs out gets 429 then (the server's timer);
- a replica steps while it has work: it takes queued requests into free slots, prefills their whole
  prompts in that step (their first token) and decodes one token for each running request;
- at every autoscaler tick the policy's controller sets the replicas from metrics scraped
  `scrape_lag_s` earlier (Prometheus' lag; 0 by default); scale-down removes starting replicas
  first, then the least-loaded ready ones, which finish what they hold before they go;
- an SLO controller also sees the latency histograms over its window as of that scrape (latency.py): each
  first token's TTFT, and each decoded token's gap (its step's duration).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from flotilla_gateway.routing import PodView, choose
from flotilla_operator.slo_scaler import SloTargets

from flotilla_sim import experiment, policies
from flotilla_sim.fluid import HOLD_CAPACITY, MAX_WAIT_S
from flotilla_sim.latency import EventWindow
from flotilla_sim.server_model import ServerProfile
from flotilla_sim.slo_policies import DEFAULT_SLO
from flotilla_sim.stats import Tally
from flotilla_sim.workload import Trace, bin_trace

ARRIVAL, STEP_DONE, READY, TIMEOUT, SCRAPE, TICK = 0, 1, 2, 3, 4, 5  # the order at equal times
TIMELINE_EVERY_S = 60.0


@dataclass
class Replica:
    address: str
    ready_s: float
    queue: deque = field(default_factory=deque)  # request ids, admitted and waiting
    running: dict = field(default_factory=dict)  # request id -> output tokens still to produce
    stepping: bool = False
    draining: bool = False
    span_start_s: float = 0.0  # a decode span: `span_steps` steps of `span_step_s`, all at one batch
    span_step_s: float = 0.0
    span_steps: int = 0
    version: int = 0  # bumped when a span is cut short; a stale STEP_DONE is ignored
    created_s: float = 0.0


class RequestSim:
    def __init__(self, trace: Trace, profile: ServerProfile, controller, initial: np.ndarray, interval_s: float,
                 num_models: int | None = None, scrape_lag_s: float = 0.0, initial_ready_s: float = 0.0) -> None:
        """`initial` replicas per model exist at 0 and are ready at `initial_ready_s`."""
        self.trace, self.profile, self.controller, self.interval_s = trace, profile, controller, interval_s
        self.scrape_lag_s = scrape_lag_s
        self.models = num_models or trace.num_models
        self.events: list = []
        self.seq = itertools.count()
        self.replicas: list[list[Replica]] = [[] for _ in range(self.models)]
        self.retired: list[Replica] = []  # draining: out of routing, still finishing work
        self.held: list[deque] = [deque() for _ in range(self.models)]
        self.woken_at = np.full(self.models, np.nan)
        self.cold_since = np.full(self.models, np.nan)
        self.first_token_s = np.full(len(trace), np.nan)  # per request, for tests and timelines
        self.finish_s = np.full(len(trace), np.nan)
        self.tally = Tally()
        self.names = itertools.count()
        self.now = 0.0
        self.ticks: list[tuple[float, np.ndarray]] = []  # (time, replicas per model) after each autoscaler tick
        for m in range(self.models):
            for _ in range(int(initial[m])):
                self._create(m, ready_s=initial_ready_s)
        for rid in range(len(trace)):
            self._push(float(trace.arrival_s[rid]), ARRIVAL, rid)
        self.latency = EventWindow(self.models, controller.window_s) if getattr(controller, "needs_latency", False) else None
        self.scrapes: dict[float, tuple] = {}  # tick time -> what Prometheus held for that tick
        self.before_start = self._scrape()  # what a tick scraping before 0 sees

    # --- bookkeeping ------------------------------------------------------------------------------
    def _push(self, time_s: float, kind: int, payload) -> None:
        heapq.heappush(self.events, (time_s, kind, next(self.seq), payload))

    def _alive(self) -> int:
        return sum(len(r) for r in self.replicas) + len(self.retired)

    def _advance(self, time_s: float) -> None:
        self.tally.gpu_s += self._alive() * (time_s - self.now)
        self.now = time_s

    def _create(self, model: int, ready_s: float) -> None:
        replica = Replica(f"m{model}-r{next(self.names)}", ready_s, created_s=self.now)
        self.replicas[model].append(replica)
        if ready_s > self.now:
            self._push(ready_s, READY, (model, replica))

    def _ready(self, model: int) -> list[Replica]:
        return [r for r in self.replicas[model] if r.ready_s <= self.now]

    # --- requests ---------------------------------------------------------------------------------
    def _arrive(self, rid: int) -> None:
        model = int(self.trace.model[rid])
        self.tally.arrived += 1
        if not self._ready(model):
            if self.controller.wakes and not self.replicas[model]:
                self._create(model, self.now + self.profile.start_s)
                self.tally.cold_starts += 1
                self.woken_at[model] = self.cold_since[model] = self.now
            if len(self.held[model]) >= HOLD_CAPACITY:
                self._refused(rid, 429)
            else:
                self.held[model].append(rid)
            return
        self._route(model, rid)

    def _route(self, model: int, rid: int) -> None:
        pods = self._ready(model)
        views = [PodView(p.address, len(p.queue) + len(p.running), len(p.queue), len(p.running), self.profile.slots,
                         self.profile.queue_capacity, 0.0, 0.0) for p in pods]
        pod = self._pick(pods, views, model, rid)
        if len(pod.queue) >= self.profile.queue_capacity:
            self._refused(rid, 429)
            return
        pod.queue.append(rid)
        if pod.stepping and pod.span_steps > 1 and len(pod.running) < self.profile.slots:
            self._cut(pod)
        self._step(pod)
        if pod.queue and pod.queue[-1] == rid:  # still waiting: its queue timeout runs
            self._push(self.trace.arrival_s[rid] + self.profile.queue_timeout_s, TIMEOUT, (pod, rid))

    def _timeout(self, pod: Replica, rid: int) -> None:
        if rid in pod.queue:
            pod.queue.remove(rid)
            self._refused(rid, 429)

    def _pick(self, pods: list[Replica], views: list[PodView], model: int, rid: int) -> Replica:
        """The gateway's choice; a subclass may play another front door."""
        chosen = choose(views, f"{model}\x00{rid}", "least-load")
        return next(p for p in pods if p.address == chosen.address)

    def _refused(self, rid: int, status: int) -> None:
        if status == 503:
            self.tally.rejected_503 += 1
        else:
            self.tally.rejected_429 += 1

    def _served(self, rid: int) -> None:
        self.finish_s[rid] = self.now
        self.tally.served += 1
        self.tally.e2e.add(self.now - self.trace.arrival_s[rid])

    def _cut(self, pod: Replica) -> None:
        """End a decode span at the step in progress, so a newly queued request joins at the next step."""
        steps = int((self.now - pod.span_start_s) / pod.span_step_s) + 1
        if steps >= pod.span_steps:
            return
        pod.version += 1
        pod.span_steps = steps
        self._push(pod.span_start_s + steps * pod.span_step_s, STEP_DONE, (pod, pod.version))

    def _release(self, model: int) -> None:
        if not np.isnan(self.cold_since[model]):
            self.tally.cold_wait.add(max(self.now - self.cold_since[model], 1e-3))
            self.cold_since[model] = np.nan
        while self.held[model]:
            rid = self.held[model].popleft()
            if self.now - self.trace.arrival_s[rid] > MAX_WAIT_S:
                self._refused(rid, 503)
            else:
                self._route(model, rid)

    def _step(self, pod: Replica) -> None:
        """Start an engine step on `pod` if it is idle and has work.

        Steps at one batch with no prefill are run as one span up to the next completion (the same
        timeline, far fewer events); a request queued meanwhile cuts the span at the step in progress."""
        if pod.stepping:
            return
        prefill = 0
        while pod.queue and len(pod.running) < self.profile.slots:
            rid = pod.queue.popleft()
            if self.now - self.trace.arrival_s[rid] > self.profile.queue_timeout_s:
                self._refused(rid, 429)
                continue
            pod.running[rid] = -int(self.trace.output_tokens[rid])  # negative: prefill pending
            prefill += int(self.trace.prompt_tokens[rid])
        if not pod.running:
            return
        decoding = sum(1 for left in pod.running.values() if left > 0)
        pod.stepping = True
        pod.span_start_s = self.now
        pod.span_step_s = float(self.profile.step_s(decoding, prefill))
        pod.span_steps = 1 if prefill else min(pod.running.values())
        pod.version += 1
        self._push(self.now + pod.span_steps * pod.span_step_s, STEP_DONE, (pod, pod.version))

    def _step_done(self, pod: Replica, version: int) -> None:
        if version != pod.version:
            return  # a span cut short: its later end was rescheduled
        pod.stepping = False
        steps = pod.span_steps
        for rid, left in list(pod.running.items()):
            arrival = self.trace.arrival_s[rid]
            if left < 0:  # its prefill ran in this step: the first token
                self.tally.ttft.add(self.now - arrival)
                self.first_token_s[rid] = self.now
                if self.latency is not None:
                    self.latency.ttft(self.now, int(self.trace.model[rid]), self.now - arrival)
                left = -left - 1
            else:
                if self.latency is not None:  # a token per step, each one step after the last
                    self.latency.itl(self.now, int(self.trace.model[rid]), pod.span_step_s, min(steps, left))
                left -= steps
            if left <= 0:
                del pod.running[rid]
                self._served(rid)
            else:
                pod.running[rid] = left
        if pod.draining and not pod.running and not pod.queue:
            self.retired.remove(pod)
            return
        self._step(pod)

    # --- the autoscaler -----------------------------------------------------------------------------
    def _scrape(self) -> tuple:
        """What Prometheus holds now: running, waiting, held, and the replicas reporting (the ready ones)."""
        return (np.array([sum(len(p.running) for p in self.replicas[m]) for m in range(self.models)], float),
                np.array([sum(len(p.queue) for p in self.replicas[m]) for m in range(self.models)], float),
                np.array([len(h) for h in self.held], float),
                np.array([len(self._ready(m)) for m in range(self.models)]))

    def _tick(self, tick_s: float) -> None:
        running, waiting, held, reporting = self.scrapes.pop(tick_s, self.before_start)
        seen = policies.Metrics(running, waiting, held, replicas=np.array([len(r) for r in self.replicas]),
                                ready=np.array([len(self._ready(m)) for m in range(self.models)]),
                                woken_at_s=self.woken_at.copy(), reporting=reporting,
                                latency=None if self.latency is None else self.latency.view(tick_s - self.scrape_lag_s))
        desired = np.asarray(self.controller.decide(self.now, seen))
        for m in range(self.models):
            while len(self.replicas[m]) < desired[m]:
                self._create(m, self.now + self.profile.start_s)
            while len(self.replicas[m]) > desired[m]:
                starting = [p for p in self.replicas[m] if p.ready_s > self.now]
                victim = starting[-1] if starting else min(self.replicas[m], key=lambda p: len(p.queue) + len(p.running))
                self.replicas[m].remove(victim)
                if victim.running or victim.queue:
                    victim.draining = True
                    self.retired.append(victim)
        self.ticks.append((self.now, np.array([len(r) for r in self.replicas])))

    def run(self, until_s: float | None = None, tick_times_s=None) -> dict:
        """Run to `until_s`; the autoscaler ticks every interval, or at `tick_times_s` (a real run's ticks)."""
        end_s = until_s if until_s is not None else float(self.trace.arrival_s[-1]) + self.interval_s
        if tick_times_s is None:
            tick_times_s = np.arange(self.interval_s, end_s + 1e-9, self.interval_s)
        for tick in tick_times_s:
            self._push(float(tick), TICK, float(tick))
            if tick - self.scrape_lag_s > 0:
                self._push(float(tick) - self.scrape_lag_s, SCRAPE, float(tick))
        next_sample = 0.0
        while self.events and self.events[0][0] <= end_s:
            time_s, kind, _, payload = heapq.heappop(self.events)
            while next_sample <= time_s:
                self.tally.timeline_s.append(next_sample)
                self.tally.timeline_replicas.append(float(sum(len(r) for r in self.replicas)))
                next_sample += TIMELINE_EVERY_S
            self._advance(time_s)
            if kind == ARRIVAL:
                self._arrive(payload)
            elif kind == STEP_DONE:
                self._step_done(*payload)
            elif kind == READY:
                if payload[1] in self.replicas[payload[0]]:
                    self._release(payload[0])
            elif kind == TIMEOUT:
                self._timeout(*payload)
            elif kind == SCRAPE:
                self.scrapes[payload] = self._scrape()
            else:
                self._tick(payload)
        self._advance(end_s)
        in_system = sum(len(p.queue) + len(p.running) for rs in self.replicas for p in rs)
        in_system += sum(len(p.queue) + len(p.running) for p in self.retired) + sum(len(h) for h in self.held)
        result = self.tally.summary(float(in_system), policies.node_pool(policies.LATENCY))
        result["fidelity"] = "request"
        return result


REQUEST_LEVEL_POLICIES = tuple(p for p in policies.ALL if p not in policies.FLUID_ONLY)


def run_policy(trace: Trace, profile: ServerProfile, policy: str, interval_s: float, tick_s: float = 5.0,
               until_s: float | None = None, slo: SloTargets = DEFAULT_SLO) -> dict:
    """One policy at request level; the shared pool runs in the fluid mode only (docs/simulation.md)."""
    if policy not in REQUEST_LEVEL_POLICIES:
        raise ValueError(f"{policy} runs in the fluid mode only; request level runs {', '.join(REQUEST_LEVEL_POLICIES)}")
    work = bin_trace(trace, tick_s)
    controller, initial = experiment.controller_for(policy, work, profile, interval_s, slo)
    result = RequestSim(trace, profile, controller, initial, interval_s).run(until_s)
    result["node_pool"] = policies.node_pool(policy)
    return result
