"""The fluid fidelity: per-model request counts per tick, numpy-vectorised over the catalogue.

Why fluid: a fleet day is ~10^10 requests, too many to list; counts per tick per model are ~10^7
numbers. Per tick, per model (docs/simulation.md, "Fluid mode"):
- a model with no ready pod holds arrivals at the front door (up to HOLD_CAPACITY, else 429; after
  MAX_WAIT_S, 503), and a policy with a front door wakes it 0 -> 1 at once: a cold start;
- what waits at a tick's end beyond `ready x queue capacity` is 429 (the admission queue's bound);
- the slots finish up to ready x slots x tick / service_s(b) requests a tick, at the last tick's batch b;
  what they cannot finish waits (Q); R = finished x service_s(b) / tick, by Little's law; a request
  counts as served in the tick it is taken into service;
- an arrival's TTFT is the queue ahead of it over the drain rate, plus half the step in progress, plus
  its prefill step, at each of the tick's prompt-length quantile points; one released
  from a hold adds its wait there;
- a pod is ready start_s after it is created; scale-down removes starting pods first (as a ReplicaSet
  does), so ready(t) = min of replicas over [t - start_s, t];
- every `interval_s`, the controller (policies.py, pool.py, slo_policies.py) sees R, Q, held and pods, and
  sets replicas; an SLO controller also sees the servers' latency histograms over its window (latency.py):
  each tick's TTFTs at their quantile points, and one inter-token gap per model, the tick's decode step,
  weighted by the tokens decoded in it (running x tick / step).
GPU-seconds count every created pod, ready or not.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from flotilla_sim.latency import TickWindow
from flotilla_sim.policies import Metrics
from flotilla_sim.progress import Progress
from flotilla_sim.server_model import ServerProfile, service_s
from flotilla_sim.stats import Tally
from flotilla_sim.workload import Binned

HOLD_CAPACITY = 256  # the gateway's per-model hold queue (docs/gateway.md)
MAX_WAIT_S = 300.0  # the gateway's maxWait


@dataclass(frozen=True)
class FluidConfig:
    interval_s: float = 15.0  # the operator's --autoscale-interval-s
    timeline_every_s: float = 60.0


def run(work: Binned, profile: ServerProfile, controller, initial: np.ndarray, node_pool: str,
        config: FluidConfig = FluidConfig(), progress: Progress | None = None) -> dict:
    """Simulate `work` under `controller`, starting from `initial` replicas per model (already ready)."""
    ticks, models = work.arrivals.shape
    dt = work.tick_s
    slots = profile.slots
    pooled = getattr(controller, "pooled", False)
    n = initial.astype(np.int64).copy()
    history: deque[np.ndarray] = deque([n.copy()], maxlen=max(math.ceil(profile.start_s / dt), 0) + 1)
    queue = np.zeros(models)  # admitted, waiting for a slot
    running = np.zeros(models)  # time-average requests holding a slot over the last tick
    batch = np.zeros(models)
    held = np.zeros(models)
    held_time_sum = np.zeros(models)  # sum of held requests' arrival times, for their mean wait
    woken_at = np.full(models, np.nan)
    held_since = np.full(models, np.nan)
    cold_since = np.full(models, np.nan)  # a wake whose first ready pod has not come yet
    tally = Tally()
    latency = TickWindow(models, dt, controller.window_s) if getattr(controller, "needs_latency", False) else None
    records = latency is not None and hasattr(controller, "record")  # a recording rule evaluated every tick
    every = max(round(config.interval_s / dt), 1)
    timeline_every = max(round(config.timeline_every_s / dt), 1)
    for t in range(ticks):
        now = t * dt
        arrivals = work.arrivals[t]
        prompt, output = work.prompt_tokens[t], work.output_tokens[t]
        tally.arrived += arrivals.sum()
        if pooled:
            ready = controller.ready(now, running + queue + held + arrivals)
            pods = controller.pods
            fresh = controller.woken_at == now
            cold_since[fresh] = now
        else:
            history.append(n.copy())
            ready = np.minimum.reduce(history).astype(np.float64)
            pods = n
        # the front door: hold while nothing is ready; wake a model at zero at once
        none_ready = ready <= 0
        if controller.wakes and not pooled:
            wake = none_ready & (n == 0) & (arrivals + held > 0)
            n = np.where(wake, 1, n)
            tally.cold_starts += wake.sum()
            woken_at = np.where(wake, now, woken_at)
            cold_since = np.where(wake, now, cold_since)
        to_hold = np.where(none_ready, arrivals, 0.0)
        room = np.maximum(HOLD_CAPACITY - held, 0.0)
        tally.rejected_429 += np.maximum(to_hold - room, 0).sum()
        took = np.minimum(to_hold, room)
        held += took
        held_time_sum += took * (now + dt / 2)
        held_since = np.where((took > 0) & np.isnan(held_since), now, held_since)
        expired = (held > 0) & (now - np.nan_to_num(held_since, nan=now) > MAX_WAIT_S)
        tally.rejected_503 += held[expired].sum()
        held[expired], held_time_sum[expired], held_since[expired] = 0.0, 0.0, np.nan
        # release the held to the first ready pod; they waited since their arrival
        release = ~none_ready & (held > 0)
        released = np.where(release, held, 0.0)
        held_wait = np.where(release, now - held_time_sum / np.maximum(held, 1e-12), 0.0)
        warmed = ~none_ready & ~np.isnan(cold_since)
        if warmed.any():
            tally.cold_wait.add(np.maximum(now - cold_since[warmed], 1e-3))
            cold_since[warmed] = np.nan
        held[release], held_time_sum[release], held_since[release] = 0.0, 0.0, np.nan
        incoming = np.where(none_ready, 0.0, arrivals) + released
        # admission, then service: capacity ready x slots, each request holding a slot hold_s
        # (the bound applies to what waits at the tick's end: arrivals over a tick also leave within it)
        hold_s = service_s(profile, batch, prompt, output)
        capacity = ready * slots * dt / hold_s  # requests the slots can finish this tick
        needing = queue + incoming
        done = np.minimum(needing, capacity)
        tally.served += done.sum()
        queue_before = queue
        overflow = np.maximum(needing - done - ready * profile.queue_capacity, 0.0)
        tally.rejected_429 += overflow.sum()
        admit = incoming - overflow
        queue = needing - done - overflow
        running = np.minimum(done * hold_s / dt, ready * slots)  # Little's law on the served flow
        batch = np.where(ready > 0, running / np.maximum(ready, 1e-12), 0.0)
        drain = np.maximum(capacity / dt, 1e-12)
        # the queue ahead over the drain rate, plus half the step in progress on a busy replica
        wait = (queue_before + queue) / 2 / drain + np.where(running > 0, 0.5 * profile.step_s(batch), 0.0)
        fresh = admit - np.minimum(released, admit)
        from_hold = admit - fresh
        decode_step = profile.step_s(batch)
        # one histogram entry per quantile point of the tick's prompt and output lengths
        prompts = work.prompt_points[t] if work.prompt_points is not None else np.array([prompt])
        outputs = work.output_points[t] if work.output_points is not None else np.array([output])
        share = 1.0 / len(prompts)
        ttft = wait[None, :] + profile.step_s(batch[None, :], prompts[:, None])  # [points, models]
        e2e = ttft + outputs[:, None] * decode_step[None, :]
        weights = np.broadcast_to(fresh * share, ttft.shape)
        if release.any():
            ttft = np.concatenate([ttft, ttft + held_wait])
            e2e = np.concatenate([e2e, e2e + held_wait])
            weights = np.concatenate([weights, np.broadcast_to(from_hold * share, weights.shape)])
        some = weights > 0
        tally.ttft.add(ttft[some], weights[some])
        tally.e2e.add(e2e[some], weights[some])
        if latency is not None:
            latency.add_tick(ttft, weights, decode_step, running * dt / np.maximum(decode_step, 1e-12))
            if records:
                controller.record(now + dt, Metrics(running, queue, held, n.copy(), np.floor(ready).astype(np.int64),
                                                    woken_at, latency=latency.view()))
        tally.gpu_s += float(np.sum(pods)) * dt
        if t % timeline_every == 0:
            tally.timeline_s.append(now)
            tally.timeline_replicas.append(float(np.sum(pods)))
        if (t + 1) % every == 0:
            seen = Metrics(running, queue, held, n.copy(), np.floor(ready).astype(np.int64), woken_at,
                           latency=latency.view() if latency is not None else None)
            if pooled:
                controller.decide(now + dt, seen)
            else:
                n = np.asarray(controller.decide(now + dt, seen), dtype=np.int64)
        if progress is not None:
            progress.advance()
    if pooled:
        tally.cold_starts = controller.cold_starts
    result = tally.summary(float(queue.sum() + held.sum()), node_pool)
    result["fidelity"] = "fluid"
    return result
