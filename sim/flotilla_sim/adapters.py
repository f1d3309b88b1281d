"""LoRA adapter routing across a fleet: the gateway's rule (flotilla_gateway.adapter_routing, imported
unchanged) against "always the holder" and "spread by load", on a trace's arrivals with Zipf-popular adapters.

Why: the rule trades two failures the peers report. Pinning an adapter to the pod that holds it makes hot
spots (one pod takes a hot adapter's whole load); spreading by load alone makes every pod load every adapter
(slot thrash: loads per hour). The simulation measures both, and whether a pod added mid-run takes adapter
traffic (AIBrix #1095: it did not).

Model (each a simplification of the server, docs/simulation.md "Adapters"):
- a pod runs up to `slots` requests at once, each for prefill (prompt tokens x PREFILL_S_PER_TOKEN) plus its
  output tokens x `tpot_s`; more wait in its FIFO queue;
- a pod holds `max_loras` adapters; a request starts only once its adapter is resident: resident already, or
  loaded into a free slot or over the least recently used adapter with no request running or waiting on that
  pod (the server's engine/adapter_residency rule), which adds LOAD_S to the request; a request that cannot
  get a slot waits without holding back the requests behind it;
- the gateway sees each pod's running and waiting counts and resident adapters at once (no report lag);
- `scale_up_at_s`: one pod joins then, empty, as a scale-up's new pod does.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
from flotilla_gateway.adapter_routing import choose_for_adapter
from flotilla_gateway.routing import PodView, choose

from flotilla_sim.workload import Trace

POLICIES = ("rule", "holder", "spread")
PREFILL_S_PER_TOKEN = 0.0001
LOAD_S = 0.2
SAMPLE_EVERY_S = 1.0


@dataclass
class Pod:
    address: str
    slots: int
    max_loras: int
    running: int = 0
    queue: deque = field(default_factory=deque)  # request indices
    resident: OrderedDict = field(default_factory=OrderedDict)  # adapter -> None, least recently used first
    in_use: dict = field(default_factory=dict)  # adapter -> requests running or waiting here
    served: int = 0

    def view(self) -> PodView:
        return PodView(address=self.address, running=self.running, waiting=len(self.queue), slots=self.slots,
                       queue_capacity=64 * self.slots, load_age_s=0.0)

    def free_adapter_slots(self) -> int:
        return self.max_loras - sum(1 for a in self.resident if self.in_use.get(a, 0) > 0)

    def acquire(self, adapter: int) -> bool | None:
        """Resident (True: loaded now, False: already there), or None when every slot is pinned."""
        if adapter in self.resident:
            self.resident.move_to_end(adapter)
            return False
        if len(self.resident) >= self.max_loras:
            victim = next((a for a in self.resident if self.in_use.get(a, 0) == 0), None)
            if victim is None:
                return None
            del self.resident[victim]
        self.resident[adapter] = None
        return True


@dataclass
class AdapterRun:
    policy: str
    hot_spot_mean: float  # mean over samples of max / mean pod load (samples with load)
    hot_spot_p95: float
    adapter_loads_per_hour: float
    latency_p50_s: float
    latency_p95_s: float
    new_pod_share: float | None  # the joined pod's share of requests in the minute after it joined
    fair_share: float | None


def run(trace: Trace, adapters: np.ndarray, policy: str, pods: int, slots: int, max_loras: int, tpot_s: float,
        scale_up_at_s: float | None = None) -> AdapterRun:
    """`adapters[i]`: request i's adapter. Every request finishes (no timeouts: queues show as latency)."""
    fleet = [Pod(f"pod-{i}", slots, max_loras) for i in range(pods)]
    in_flight: dict[int, int] = {}  # adapter -> requests in flight fleet-wide
    events: list = []
    seq = itertools.count()
    for i, t in enumerate(trace.arrival_s):
        heapq.heappush(events, (float(t), 1, next(seq), "arrive", i))
    if scale_up_at_s is not None:
        heapq.heappush(events, (scale_up_at_s, 0, next(seq), "join", -1))
    end_s = float(trace.arrival_s[-1]) if len(trace) else 0.0
    for s in np.arange(0.0, end_s, SAMPLE_EVERY_S):
        heapq.heappush(events, (float(s), 2, next(seq), "sample", -1))
    loads, latencies, ratios, joined = 0, np.zeros(len(trace)), [], None
    joined_served: list[float] = []
    pod_of: dict[int, Pod] = {}

    def start_what_fits(pod: Pod, now: float) -> None:
        nonlocal loads
        waiting = deque()
        while pod.queue and pod.running < pod.slots:
            i = pod.queue.popleft()
            got = pod.acquire(int(adapters[i]))
            if got is None:
                waiting.append(i)
                continue
            loads += int(got)
            pod.running += 1
            service = trace.prompt_tokens[i] * PREFILL_S_PER_TOKEN + trace.output_tokens[i] * tpot_s + (LOAD_S if got else 0)
            heapq.heappush(events, (now + float(service), 0, next(seq), "done", i))
        pod.queue.extendleft(reversed(waiting))

    while events:
        now, _, _, kind, i = heapq.heappop(events)
        if kind == "join":
            joined = Pod(f"pod-{len(fleet)}", slots, max_loras)
            fleet.append(joined)
        elif kind == "sample":
            load = np.array([p.running + len(p.queue) for p in fleet])
            if load.mean() > 0:
                ratios.append(load.max() / load.mean())
        elif kind == "arrive":
            adapter = int(adapters[i])
            pod = _route(policy, fleet, adapter, in_flight.get(adapter, 0), i)
            pod_of[i] = pod
            in_flight[adapter] = in_flight.get(adapter, 0) + 1
            pod.in_use[adapter] = pod.in_use.get(adapter, 0) + 1
            pod.served += 1
            if pod is joined and now <= scale_up_at_s + 60:
                joined_served.append(now)
            pod.queue.append(i)
            start_what_fits(pod, now)
        else:  # done
            pod, adapter = pod_of.pop(i), int(adapters[i])
            latencies[i] = now - trace.arrival_s[i]
            pod.running -= 1
            pod.in_use[adapter] -= 1
            in_flight[adapter] -= 1
            start_what_fits(pod, now)
    hours = max(end_s, 1.0) / 3600
    share = fair = None
    if joined is not None:
        window = (trace.arrival_s > scale_up_at_s) & (trace.arrival_s <= scale_up_at_s + 60)
        share = len(joined_served) / max(1, int(window.sum()))
        fair = 1 / len(fleet)
    return AdapterRun(policy, float(np.mean(ratios)) if ratios else 1.0,
                      float(np.percentile(ratios, 95)) if ratios else 1.0, loads / hours,
                      float(np.percentile(latencies, 50)), float(np.percentile(latencies, 95)), share, fair)


def _route(policy: str, fleet: list[Pod], adapter: int, adapter_load: int, request: int) -> Pod:
    by_address = {p.address: p for p in fleet}
    views = [p.view() for p in fleet]
    holders = frozenset(p.address for p in fleet if adapter in p.resident)
    if policy == "rule":
        chosen = choose_for_adapter(views, f"adapter-{adapter}", holders, adapter_load,
                                    {p.address: p.free_adapter_slots() for p in fleet})
    elif policy == "holder" and holders:
        chosen = choose([v for v in views if v.address in holders], f"adapter-{adapter}", "least-load")
    else:  # spread, and a holder policy's adapter that no pod holds yet
        chosen = choose(views, f"{adapter}\x00{request}", "least-load")
    assert chosen is not None
    return by_address[chosen.address]


def zipf_adapters(count: int, num_adapters: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Each request's adapter: adapter k (0-based) drawn with weight 1 / (k + 1) ** exponent."""
    weights = 1.0 / np.arange(1, num_adapters + 1) ** exponent
    return rng.choice(num_adapters, size=count, p=weights / weights.sum())


def markdown(runs: list[AdapterRun]) -> str:
    lines = ["| policy | hot-spot ratio (mean / p95) | adapter loads per hour | latency p50 / p95 (s) | new pod's share "
             "in its first minute (fair) |", "|---|---:|---:|---:|---:|"]
    for r in runs:
        share = "—" if r.new_pod_share is None else f"{r.new_pod_share:.2f} ({r.fair_share:.2f})"
        lines.append(f"| {r.policy} | {r.hot_spot_mean:.2f} / {r.hot_spot_p95:.2f} | {r.adapter_loads_per_hour:,.0f} | "
                     f"{r.latency_p50_s:.1f} / {r.latency_p95_s:.1f} | {share} |")
    return "\n".join(lines) + "\n"


def to_json(config: dict, runs: list[AdapterRun]) -> str:
    import dataclasses
    import json

    return json.dumps({"config": config, "runs": [dataclasses.asdict(r) for r in runs]}, indent=1) + "\n"
