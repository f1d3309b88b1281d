"""Adaptive tiering on the whole loop: a model of `placement.policy: adaptive` is promoted from its pool to
dedicated replicas and demoted back, through flotilla-gateway, under a stream of requests that never stops.

The story, in one test so that the pool, the gateway and the stream are started once:
1. the model joins its pool (status.tier pool, status.pool set) and serves one client there;
2. demand rises to four clients (two replicas' worth of `maxNumSeqs: 2`): a promotion starts, but its pods
   cannot start (a bad `server.extraArgs`), so it is rolled back after `startTimeoutSeconds`, Degraded
   PromotionFailed, and the pool keeps serving;
3. the spec is fixed; the next promotion's replica becomes ready, the gateway switches, and the operator is
   restarted between the switch and the end of the drain: the new process completes the move from status;
4. demand falls to a trickle: a demotion has the pool load the model first, then the gateway switches, and the
   dedicated replicas drain to zero.
Every request of the stream must complete (0 failed), and none may wait longer than one cold load; the Events
tell the story in order, and status.tier (kubectl get im's TIER) changes with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import httpx

from e2e.conftest import SERVER_START_S, SETTLE_S
from e2e.harness import POOLS, Loop, epoch, inference_model, model_pool
from tests.support.gateway_cluster import gateway_process

POOL, NAME = "tierpool", "tiered"
KV_BYTES = 4 * 2**20
TIERING = {"windowSeconds": 6, "minStaySeconds": 0, "promoteDemandReplicas": 1.0, "demoteDemandReplicas": 0.3,
           "promoteColdLoadsPerHour": 0, "switchGraceSeconds": 4, "drainTimeoutSeconds": 30}
FAILING_START_S = 12  # startTimeoutSeconds of the promotion whose pods cannot start
START_S = int(SERVER_START_S)  # of the one that can


@dataclass
class Result:
    sent_s: float
    first_token_s: float | None
    status: int
    done: bool
    error: str = ""


@dataclass
class Stream:
    """`level` workers send streamed completions through the gateway, one after another; worker 0 paces itself
    to one request every `pause_s` when the level is 1 (a trickle)."""

    url: str
    level: int = 1
    pause_s: float = 0.0
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Stream:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=180) as client:
            await asyncio.gather(*(self._worker(client, i) for i in range(4)))

    async def _worker(self, client: httpx.AsyncClient, index: int) -> None:
        while not self._stop.is_set():
            if index >= self.level:
                await asyncio.sleep(0.1)
                continue
            self.results.append(await self._one(client))
            if self.level == 1 and self.pause_s:
                await asyncio.sleep(self.pause_s)

    async def _one(self, client: httpx.AsyncClient) -> Result:
        sent, first, done, status, error = time.time(), None, False, 0, ""
        body = {"model": NAME, "prompt": "story", "max_tokens": 16, "stream": True, "ignore_eos": True}
        try:
            async with client.stream("POST", self.url + "/v1/completions", json=body) as r:
                status = r.status_code
                if status != 200:
                    error = (await r.aread()).decode(errors="replace")[:300]
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and first is None:
                        first = time.time()
                    done = done or line == "data: [DONE]"
        except httpx.HTTPError as failure:
            status, error = -1, repr(failure)
        return Result(sent, first, status, done, error)


def phase(loop: Loop) -> str:
    status = loop.model(NAME).get("status") or {}
    return (status.get("move") or {}).get("phase") or ""


def tier_events(loop: Loop) -> list[tuple[float, str]]:
    reasons = ("PromotionStarted", "DemotionStarted", "TierRouteSwitched", "TierDraining", "TierMoved",
               "TierMoveRolledBack")
    found = [(epoch(e["firstTimestamp"]), e["reason"]) for reason in reasons for e in loop.events(NAME, reason)]
    return sorted(found)


def test_a_model_is_promoted_and_demoted_without_dropping_a_request(loop: Loop, tmp_path) -> None:
    pool = model_pool(POOL, 512 * 2**20, replicas=1, max_num_seqs=4, minReplicas=1, maxReplicas=1,
                      extra_args=("--kv-cache-memory", str(KV_BYTES), "--min-residency-s", "0"))
    model = inference_model(NAME, "adaptive", replicas=1, minReplicas=1, maxReplicas=1)
    # a long minimum stay holds a second attempt after the rollback until the spec is fixed
    model["spec"] |= {"pool": POOL, "tiering": TIERING | {"startTimeoutSeconds": FAILING_START_S,
                                                          "minStaySeconds": 3600}}
    model["spec"]["server"]["extraArgs"] = ["--no-such-flag"]  # its dedicated pods exit at once
    loop.apply(pool)
    loop.apply(model)
    tiers: list[tuple[float, str | None]] = []
    try:
        with gateway_process(loop.k8s.kubeconfig, tmp_path, "--namespace", "default") as gateway:
            loop.wait(lambda: loop.model(NAME).get("status", {}).get("pool") == POOL, SETTLE_S, "the model in its pool")
            loop.wait(lambda: loop.runner.endpoints(f"{POOL}-pool"), SERVER_START_S, "the pool's pod ready")
            with Stream(gateway.url) as stream:
                def record() -> str | None:
                    tier = (loop.model(NAME).get("status") or {}).get("tier")
                    if not tiers or tiers[-1][1] != tier:
                        tiers.append((time.time(), tier))
                    return tier

                loop.wait(lambda: any(r.done for r in stream.results), SETTLE_S, "the pool serves the model")
                # 2. demand rises; the promotion's pods cannot start: rolled back, the pool keeps serving
                stream.level = 4
                loop.wait(lambda: loop.events(NAME, "TierMoveRolledBack"), SETTLE_S + FAILING_START_S,
                          "the failed promotion rolled back")
                loop.wait(lambda: loop.condition(NAME, "Degraded").get("reason") == "PromotionFailed", SETTLE_S,
                          "Degraded PromotionFailed")
                assert record() == "pool" and loop.model(NAME)["status"]["pool"] == POOL
                loop.wait(lambda: loop.k8s.get("apps/v1", "deployments", NAME, "default") is None, SETTLE_S,
                          "the failed promotion's Deployment removed")
                # 3. fixed: the next promotion completes, across an operator restart between switch and drain
                loop.k8s.patch("flotilla.dev/v1alpha1", "inferencemodels", NAME, "default", {"spec": {
                    "server": {"extraArgs": []}, "tiering": {"startTimeoutSeconds": START_S, "minStaySeconds": 0}}})
                loop.wait(lambda: phase(loop) in ("Switching", "Draining"), SETTLE_S + START_S,
                          "the promotion's replica ready and the route switched")
                record()
                loop.restart_operator()
                loop.wait(lambda: record() == "dedicated" and not phase(loop), SETTLE_S, "the promotion done")
                assert loop.model(NAME)["status"].get("pool") is None  # the gateway routes to its own replicas
                assert loop.condition(NAME, "Degraded").get("status") != "True"
                promoted_at = time.time()
                loop.wait(lambda: any(r.done and r.sent_s > promoted_at for r in stream.results), SETTLE_S,
                          "the dedicated replica serves")
                # 4. demand falls to a trickle: demoted, the pool loading the model before the switch
                stream.level, stream.pause_s = 1, 1.0
                loop.wait(lambda: record() == "pool" and not phase(loop), SETTLE_S + START_S, "the demotion done")
                loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "the dedicated replicas gone")
                assert loop.model(NAME)["status"]["pool"] == POOL
                demoted_at = time.time()
                loop.wait(lambda: any(r.done and r.sent_s > demoted_at for r in stream.results), SETTLE_S,
                          "the pool serves the model again")
        results = stream.results
        failures = [r for r in results if r.status != 200 or not r.done]
        waits = sorted(r.first_token_s - r.sent_s for r in results if r.first_token_s is not None)
        events = tier_events(loop)
        story = [reason for _, reason in events]
        pool_pod = loop.runner.endpoints(f"{POOL}-pool")
        print(f"\ntier moves e2e: {len(results)} requests, {len(failures)} failed; TTFT max {waits[-1]:.2f} s, "
              f"p50 {waits[len(waits) // 2]:.3f} s; tiers {[t for _, t in tiers]}; events {story}")
        assert failures == [], (len(failures), [(r.sent_s - results[0].sent_s, r.status, r.error) for r in failures[:3]],
                                [(t - results[0].sent_s, reason) for t, reason in events])
        assert story == ["PromotionStarted", "TierMoveRolledBack",
                         "PromotionStarted", "TierRouteSwitched", "TierDraining", "TierMoved",
                         "DemotionStarted", "TierRouteSwitched", "TierDraining", "TierMoved"], events
        assert [t for _, t in tiers] == ["pool", "dedicated", "pool"], tiers
        # no request waited longer than one cold load: the pool's loads (a load's histogram) bound every wait
        load_s = max(_load_seconds(pool_pod), 1.0)
        assert waits[-1] <= load_s + 2.0, (waits[-5:], load_s)
    finally:
        loop.delete(NAME)
        loop.delete(POOL, POOLS)
        loop.wait(lambda: loop.runner.processes(NAME) + loop.runner.processes(f"{POOL}-pool") == 0, SETTLE_S,
                  "servers stopped")


def _load_seconds(pods: list[str]) -> float:
    """The longest load a pool pod recorded (the top of its load histogram's populated buckets)."""
    longest = 0.0
    for pod in pods:
        text = httpx.get(pod + "/metrics", timeout=5).text
        buckets = [line for line in text.splitlines() if line.startswith("flotilla_model_load_seconds_bucket")]
        counts = [(float(line.split('le="')[1].split('"')[0]), float(line.rsplit(" ", 1)[1])) for line in buckets]
        total = max((c for _, c in counts), default=0.0)
        longest = max(longest, next((le for le, c in sorted(counts) if c >= total and total > 0), 0.0))
    return longest

