"""The benchmark's two arms on the whole loop (e2e/harness.py): the same four tiny models, once as cost-first
members of one ModelPool of 2 replicas whose memory budget holds 2 models per replica, once as 4 dedicated
InferenceModels of 1 replica each. Both are fixed in size (autoscaler bounds min = max), both are reached
through a fresh flotilla-gateway, and both get the same server settings, so what differs is the layout.

`run_arm` applies an arm, waits until the gateway lists its models, every replica is ready and the gateway
routes to each and has read its load (polled, not a fixed pause: a busy machine can take longer), replays the
trace while a sampler records ready replicas (the Deployments' status, as the pod runner reports it) and,
for the pool, each pod's model states; it reads the servers' and the gateway's counters, then deletes the
arm and waits for its processes to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness import NAMESPACE, POOLS, Loop, inference_model, model_pool
from e2e.pool_bench.replay import Result, replay
from e2e.pool_bench.trace import Request
from tests.support.gateway_cluster import gateway_process

POOL = "bench"
POOL_DEPLOYMENT = f"{POOL}-pool"
START_TIMEOUT_S = 600.0  # every server importing torch at once on a busy 2-core machine
SAMPLE_EVERY_S = 0.2


@dataclass(frozen=True)
class Settings:
    """What both arms' servers share, and the pool's own sizes."""

    kv_cache_bytes: int = 16 * 2**20  # each model's KV pool: 8,192 tokens of tiny
    max_num_seqs: int = 8
    queue_timeout_s: int = 120
    engine_mode: str = "process"  # the servers' default: each loaded model in its own engine process
    pool_replicas: int = 2
    models_per_replica: int = 2  # the pool's budget per replica holds this many models, not one more
    min_residency_s: float = 15.0  # the server's default 60 s, divided by the trace's compression


def server_spec(settings: Settings, *extra: str) -> dict[str, Any]:
    return {"maxNumSeqs": settings.max_num_seqs, "maxBatchedTokens": 512, "prefillChunk": 256,
            "queueDepthPerSlot": 8, "queueTimeoutSeconds": settings.queue_timeout_s, "drainTimeoutSeconds": 5,
            "extraArgs": ["--kv-cache-memory", str(settings.kv_cache_bytes), "--engine-mode", settings.engine_mode,
                          *extra]}


def pool_objects(names: Sequence[str], footprint_bytes: int, settings: Settings) -> list[dict[str, Any]]:
    """The pool (budget: models_per_replica footprints and a half) and its cost-first members."""
    budget = footprint_bytes * (2 * settings.models_per_replica + 1) // 2
    n = settings.pool_replicas
    pool = model_pool(POOL, budget, replicas=n, minReplicas=n, maxReplicas=n)
    pool["spec"]["server"] = server_spec(settings, "--min-residency-s", f"{settings.min_residency_s:g}")
    members = []
    for name in names:
        member = inference_model(name, "cost-first", replicas=1)
        member["spec"]["pool"] = POOL
        member["spec"]["server"] = server_spec(settings)
        members.append(member)
    return [pool, *members]


def dedicated_objects(names: Sequence[str], settings: Settings) -> list[dict[str, Any]]:
    out = []
    for name in names:
        model = inference_model(name, "latency-first", replicas=1, minReplicas=1, maxReplicas=1)
        model["spec"]["server"] = server_spec(settings)
        out.append(model)
    return out


@dataclass
class Sampler:
    """Every SAMPLE_EVERY_S on its own thread: the arm's ready replicas, and each pool pod's model states."""

    api_url: str
    deployments: tuple[str, ...]
    pool_pods: list[str] = field(default_factory=list)  # base URLs whose /flotilla/v1/load to read
    replicas: list[tuple[float, int]] = field(default_factory=list)  # (time.monotonic(), ready replicas)
    states: list[tuple[float, dict[str, set[str]]]] = field(default_factory=list)  # (t, {model: states on pods})
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last: dict[str, int] = {}  # a read that fails (a busy API emulator) keeps the Deployment's last figure
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                now = time.monotonic()
                for name in self.deployments:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        r = client.get(f"{self.api_url}/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
                        if r.status_code in (200, 404):
                            last[name] = int(((r.json() if r.status_code == 200 else {}).get("status") or {})
                                             .get("readyReplicas") or 0)
                self.replicas.append((now, sum(last.values())))
                seen: dict[str, set[str]] = {}
                for url in self.pool_pods:
                    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                        for m in client.get(url + "/flotilla/v1/load").json()["models"]:
                            seen.setdefault(m["name"], set()).add(m["state"])
                if self.pool_pods:
                    self.states.append((now, seen))
                self._stop.wait(SAMPLE_EVERY_S)

    def loaded_nowhere(self, r: Result) -> bool:
        """At some sample between the request's sending and its first token, no pool pod had its model loaded."""
        end = r.first_token_s if r.first_token_s is not None else (r.done_s or r.sent_s)
        return any("loaded" not in states.get(r.model, set()) for t, states in self.states if r.sent_s <= t <= end)


def counters(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, summed over labels but `tier` and `code`: {name or name{label}: value}."""
    out: dict[str, float] = {}
    text = httpx.get(url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"{{{k}={s.labels[k]}}}" for k in ("tier", "code") if k in s.labels)
            out[key] = out.get(key, 0.0) + s.value
    return out


@dataclass
class ArmRun:
    name: str
    names: dict[str, str]  # trace model -> served name in this arm
    applied_s: float = 0.0
    ready_s: float = 0.0
    start_s: float = 0.0  # the replay's start
    end_s: float = 0.0  # the last request's end
    results: list[Result] = field(default_factory=list)
    replicas: list[tuple[float, int]] = field(default_factory=list)
    cold_sampled: list[bool] = field(default_factory=list)  # per result: its model loaded on no pod while it waited
    server: dict[str, float] = field(default_factory=dict)  # pool pods' counters, summed
    gateway: dict[str, float] = field(default_factory=dict)
    loadavg: dict[str, str] = field(default_factory=dict)


def gateway_caught_up(url: str, models: tuple[str, ...], pods_each: int) -> bool:
    """The gateway's endpoint watch and load polls caught up with the ready pods: each model has `pods_each`
    ready pods in /v1/models, and the gateway has read the load of every one (flotilla_gateway_pod_load)."""
    data = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}
    if any(data.get(name, {}).get("ready_replicas") != pods_each for name in models):
        return False
    text = httpx.get(url + "/metrics", timeout=5).text
    ages = [s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "flotilla_gateway_pod_load" and s.labels.get("figure") == "age_seconds"
            and s.labels.get("model") in models]
    return len(ages) >= len(models) * pods_each and all(age >= 0 for age in ages)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def run_arm(loop: Loop, arm: str, requests: Sequence[Request], models: Sequence[str], settings: Settings,
            footprint_bytes: int, workdir: Path) -> ArmRun:
    names = {m: f"{arm[0]}-{m}" for m in models}
    objects = (pool_objects(list(names.values()), footprint_bytes, settings) if arm == "pool"
               else dedicated_objects(list(names.values()), settings))
    deployments = (POOL_DEPLOYMENT,) if arm == "pool" else tuple(names.values())
    replicas = settings.pool_replicas if arm == "pool" else len(names)
    run = ArmRun(arm, names, loadavg={"before": loadavg()})
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with gateway_process(loop.k8s.kubeconfig, workdir, "--namespace", NAMESPACE) as gateway, \
                Sampler(loop.k8s.url, deployments) as sampler:
            run.applied_s = time.monotonic()
            for obj in objects:
                loop.apply(obj)

            def listed() -> bool:
                data = {m["id"]: m for m in httpx.get(gateway.url + "/v1/models", timeout=5).json()["data"]}
                return all(n in data and (arm != "pool" or data[n].get("pool") == POOL) for n in names.values())

            loop.wait(listed, START_TIMEOUT_S, f"{arm}: the gateway lists the arm's models")
            loop.wait(lambda: sum(len(loop.runner.endpoints(d)) for d in deployments) == replicas, START_TIMEOUT_S,
                      f"{arm}: {replicas} replicas ready", interval_s=1.0)
            per_model = settings.pool_replicas if arm == "pool" else 1
            loop.wait(lambda: gateway_caught_up(gateway.url, tuple(names.values()), per_model), START_TIMEOUT_S,
                      f"{arm}: the gateway routes to every ready pod and has read its load", interval_s=0.5)
            run.ready_s = time.monotonic()
            if arm == "pool":
                sampler.pool_pods = loop.runner.endpoints(POOL_DEPLOYMENT)
            renamed = [Request(r.at_s, names[r.model], r.prompt_tokens, r.output_tokens) for r in requests]
            run.loadavg["replay_start"] = loadavg()
            run.start_s, run.results = asyncio.run(replay(gateway.url, renamed))
            run.end_s = max(r.done_s or r.sent_s for r in run.results)
            run.loadavg["replay_end"] = loadavg()
            run.replicas = list(sampler.replicas)
            run.cold_sampled = [arm == "pool" and sampler.loaded_nowhere(r) for r in run.results]
            for url in sampler.pool_pods:
                for key, value in counters(url).items():
                    run.server[key] = run.server.get(key, 0.0) + value
            run.gateway = counters(gateway.url)
    finally:
        for name in names.values():
            loop.delete(name)
        if arm == "pool":
            loop.delete(POOL, POOLS)
        loop.wait(lambda: sum(loop.runner.processes(d) for d in deployments) == 0, 120, f"{arm}: servers stopped")
    return run
