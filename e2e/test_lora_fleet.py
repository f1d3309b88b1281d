"""A fleet serving LoRA adapters, the whole loop (issue 36, "Fleet, in the e2e loop"): one InferenceModel of a
small random Llama on a PersistentVolumeClaim, 3 replicas, 12 adapters from the same claim in `spec.adapters` and
`maxLoras: 4` (12 slots in the fleet, so which pod holds which adapter matters), behind a real flotilla-gateway.

- a hot adapter's requests (16 clients at once) are served by at least 2 pods, and the cold adapters'
  requests by at least 2 pods (docs/gateway.md, "Adapter routing": an adapter may use 1 + in-flight // 8 pods);
- a scale-up (scaling.minReplicas 3 -> 4) brings a pod that serves adapter requests within a minute of the
  operator's scale, and within seconds of turning ready (a new pod has every adapter slot free);
- the gateway's /v1/models lists the model and each of the 12 adapters once, the adapters with the model as
  parent;
- every request through the gateway is answered 200;
- the operator's status.adapters says every ready pod serves every adapter, and that pods hold adapters in slots.

The claim is a directory here (PodRunner.claims, e2e/pod_volumes.py): the operator renders the model's `--model`
under /models and the adapter list ConfigMap's lines under /adapters/pvc/CLAIM, and the pod runner points both
at that directory. Which pod served what is read from the servers' own counters
(`flotilla_lora_requests_total{adapter}`), and when, from the gateway's access log; the scale from the
operator's Event. Windows are short (a few seconds of traffic each): longer runs belong to `make bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.conftest import SERVER_START_S, SETTLE_S
from e2e.harness import GROUP_VERSION, NAMESPACE, PLURAL, Loop, epoch, inference_model
from tests.support.gateway_cluster import gateway_process
from tests.support.hf_models import make_hf_model_dir
from tests.support.lora_adapters import make_lora_adapter

NAME = "lora-fleet"
CLAIM = "lora-fleet-files"
ADAPTERS = [f"tune-{i:02d}" for i in range(12)]
HOT, COLD = ADAPTERS[0], ADAPTERS[1:]
MAX_LORAS = 4
SLOTS = 4  # maxNumSeqs per pod
HOT_CLIENTS, HOT_EACH = 16, 5  # 16 in flight at the gateway: the hot adapter may use 1 + 16 // 8 = 3 pods
COLD_CLIENTS, COLD_EACH = 4, 2  # each cold adapter asked COLD_EACH times
MAX_TOKENS = 12
NEW_POD_WITHIN_S = 60.0  # the must-show: the scale-up's pod takes adapter traffic within a minute


def write_claim(root: Path) -> Path:
    """The claim's files: the base model at base/, each adapter (rank 4, its own seed) at adapters/NAME."""
    base = make_hf_model_dir("llama", root / "base")
    for i, adapter in enumerate(ADAPTERS):
        make_lora_adapter(base, root / "adapters" / adapter, rank=4, seed=100 + i)
    return root


def lora_model(replicas: int) -> dict:
    obj = inference_model(NAME, "cost-first", replicas=replicas, max_num_seqs=SLOTS, minReplicas=replicas,
                          maxReplicas=replicas)
    obj["spec"]["model"] = {"name": NAME, "source": {"pvc": {"claimName": CLAIM, "path": "base"}}}
    obj["spec"]["adapters"] = [{"name": a, "source": {"pvc": {"claimName": CLAIM, "path": f"adapters/{a}"}}}
                               for a in ADAPTERS]
    obj["spec"]["server"].update({"maxLoras": MAX_LORAS, "maxLoraRank": 8})
    return obj


def served_by_pod(urls: list[str]) -> dict[str, dict[str, float]]:
    """Each pod's `flotilla_lora_requests_total` by adapter (the server's own count), keyed host:port."""
    out: dict[str, dict[str, float]] = {}
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=5).text
        out[url.removeprefix("http://")] = {
            s.labels["adapter"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "flotilla_lora_requests_total" and "adapter" in s.labels}
    return out


def access_lines(gateway_log: str) -> list[dict]:
    return [json.loads(line) for line in gateway_log.splitlines()
            if line.startswith("{") and '"flotilla_gateway.access"' in line]


class Traffic:
    """Closed-loop clients through the gateway on a thread of their own; every status kept as (model, status)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[str, int]] = []
        self.stop = threading.Event()

    async def _client(self, client: httpx.AsyncClient, models: list[str] | None, cycle: list[str], i: int) -> None:
        k = 0
        while (models is not None and k < len(models)) or (models is None and not self.stop.is_set()):
            model = models[k] if models is not None else cycle[(i + k) % len(cycle)]
            k += 1
            try:
                r = await client.post(self.url + "/v1/completions", json={
                    "model": model, "prompt": f"client {i} request {k}", "max_tokens": MAX_TOKENS,
                    "temperature": 0, "ignore_eos": True})
                self.results.append((model, r.status_code))
            except httpx.HTTPError as error:
                self.results.append((model, -1))
                print(f"{model}: {error!r}")

    async def run(self, fixed: list[list[str]], looping: list[list[str]]) -> None:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
            await asyncio.gather(*(self._client(client, models, [], i) for i, models in enumerate(fixed)),
                                 *(self._client(client, None, cycle, i) for i, cycle in enumerate(looping)))

    def failed(self) -> list[tuple[str, int]]:
        return [(m, s) for m, s in self.results if s != 200]


def test_lora_fleet_spreads_hot_adapters_and_scale_up_takes_adapter_traffic(loop: Loop, tmp_path: Path) -> None:
    started = time.monotonic()
    loop.runner.claims[CLAIM] = write_claim(tmp_path / "claim")
    loop.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NAMESPACE},
                "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    loop.apply(lora_model(3))
    try:
        with gateway_process(loop.k8s.kubeconfig, tmp_path, "--namespace", NAMESPACE) as gateway:
            def fleet_listed() -> list[dict]:
                cards = httpx.get(gateway.url + "/v1/models", timeout=5).json()["data"]
                model = next((c for c in cards if c["id"] == NAME), None)
                ready = model is not None and model.get("ready_replicas") == 3 and len(loop.runner.endpoints(NAME)) == 3
                return cards if ready and len(cards) == 1 + len(ADAPTERS) else []

            cards = loop.wait(fleet_listed, SERVER_START_S, "3 pods ready and the gateway listing the 12 adapters")
            up_s = time.monotonic() - started
            old = loop.runner.endpoints(NAME)
            # /v1/models: the fleet's union, each name once, adapters under their model
            assert [c["id"] for c in cards] == [NAME, *ADAPTERS], [c["id"] for c in cards]
            assert all(c.get("parent") == NAME for c in cards[1:]), cards

            # 1. a hot adapter under load and the cold ones, at once
            traffic = Traffic(gateway.url)
            hot = [[HOT] * HOT_EACH for _ in range(HOT_CLIENTS)]
            cold = [COLD[i::COLD_CLIENTS] * COLD_EACH for i in range(COLD_CLIENTS)]
            load_started = time.monotonic()
            asyncio.run(traffic.run(hot + cold, []))
            load_s = time.monotonic() - load_started
            counts = served_by_pod(old)
            hot_pods = {pod: c.get(HOT, 0) for pod, c in counts.items()}
            cold_pods = {pod: sum(c.get(a, 0) for a in COLD) for pod, c in counts.items()}
            print(f"\nlora fleet: 3 pods ready and listed {up_s:.1f} s after apply; {len(traffic.results)} requests "
                  f"in {load_s:.1f} s; hot {HOT} per pod {sorted(hot_pods.values())}, cold per pod "
                  f"{sorted(cold_pods.values())}")
            assert traffic.failed() == [], traffic.failed()[:5]
            assert sum(hot_pods.values()) == HOT_CLIENTS * HOT_EACH, hot_pods
            assert sum(cold_pods.values()) == len(COLD) * COLD_EACH, cold_pods
            assert sum(n > 0 for n in hot_pods.values()) >= 2, hot_pods  # the hot adapter spread to a second pod
            assert sum(n > 0 for n in cold_pods.values()) >= 2, cold_pods  # the cold ones spread

            # 2. a scale-up under light adapter traffic: the new pod takes some
            light = Traffic(gateway.url)
            cycles = [[*ADAPTERS[i::3], HOT] for i in range(3)] + [[HOT]] * 3
            runner = threading.Thread(target=lambda: asyncio.run(light.run([], cycles)), daemon=True)
            runner.start()
            try:
                scale_epoch_s = time.time()
                loop.k8s.patch(GROUP_VERSION, PLURAL, NAME, NAMESPACE,
                               {"spec": {"scaling": {"minReplicas": 4, "maxReplicas": 4}}})
                loop.wait(lambda: len(loop.runner.endpoints(NAME)) == 4, SERVER_START_S, "the fourth pod serving")
                new_url = next(u for u in loop.runner.endpoints(NAME) if u not in old)
                new_pod = new_url.removeprefix("http://")

                def new_pod_served() -> list[dict]:
                    return [e for e in access_lines(gateway.log()) if e.get("pod") == new_pod
                            and e.get("base") == NAME and e.get("status") == 200]

                loop.wait(new_pod_served, NEW_POD_WITHIN_S, "the new pod serving adapter requests")
                time.sleep(1.0)  # a little traffic on four pods
            finally:
                light.stop.set()
                runner.join(60)
            gateway_log = gateway.log()
            final_cards = httpx.get(gateway.url + "/v1/models", timeout=5).json()["data"]
        scales = [t for t, before, after in loop.scales(NAME) if t >= scale_epoch_s - 1 and after == 4]
        assert scales, loop.scales(NAME)
        scaled_epoch_s = min(scales)
        ready_epoch_s = max(loop.runner.ready_epochs[NAME])
        on_new = [e for e in access_lines(gateway_log) if e.get("pod") == new_pod and e.get("base") == NAME
                  and e.get("status") == 200]
        first_on_new = min(epoch(e["ts"]) - e["duration_s"] for e in on_new)  # its arrival at the gateway
        new_counts = served_by_pod([new_url])[new_pod]
        print(f"scale-up: 3 -> 4 by the operator {scaled_epoch_s - scale_epoch_s:.1f} s after the patch; the new pod "
              f"ready {ready_epoch_s - scaled_epoch_s:.1f} s after the scale, its first adapter request "
              f"{first_on_new - ready_epoch_s:.1f} s after it turned ready ({first_on_new - scaled_epoch_s:.1f} s "
              f"after the scale); it served {sum(new_counts.values()):.0f} adapter requests "
              f"({len(new_counts)} adapters); light traffic {len(light.results)} requests")
        assert light.failed() == [], light.failed()[:5]
        assert sum(new_counts.values()) > 0, new_counts  # the server's own count agrees with the gateway's log
        assert first_on_new - scaled_epoch_s <= NEW_POD_WITHIN_S, first_on_new - scaled_epoch_s
        assert first_on_new - ready_epoch_s <= 10.0, first_on_new - ready_epoch_s
        assert [c["id"] for c in final_cards] == [NAME, *ADAPTERS], [c["id"] for c in final_cards]

        # 3. the operator's status: every ready pod serves each adapter, and pods hold adapters in slots
        def status_adapters() -> list[dict]:
            rows = (loop.model(NAME).get("status") or {}).get("adapters") or []
            return rows if [r["name"] for r in rows] == ADAPTERS and all(r["pods"] == 4 for r in rows) \
                and sum(r.get("resident", 0) for r in rows) > 0 else []

        rows = loop.wait(status_adapters, SETTLE_S, "status.adapters with 4 pods serving each adapter")
        resident = sum(r.get("resident", 0) for r in rows)
        print(f"status.adapters: every adapter on 4 pods, {resident} (pod, adapter) pairs resident "
              f"(at most {4 * MAX_LORAS}); whole test {time.monotonic() - started:.1f} s")
        assert resident <= 4 * MAX_LORAS, rows
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers of the deleted model stopped")
        loop.runner.claims.pop(CLAIM, None)
        with contextlib.suppress(Exception):
            loop.k8s.delete("v1", "persistentvolumeclaims", CLAIM, NAMESPACE)
