"""A real multi-model flotilla-server on CPU: three small models, a memory budget that holds two, requests
that cycle through all three (docs/serving.md, "Multi-model mode").

One server process serves every test here (start-up dominates on a shared CPU). The figures the step-rate
test measures (resident step rate idle and while another model loads, the TTFT rise) are printed; run
`pytest tests/server/model_cache/test_multimodel_server.py -s` to see them.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.engine_processes import EngineProcesses
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import ServerProcess, run_server
from tests.support.hf_models import make_hf_model_dir

pytestmark = pytest.mark.serial  # step-rate ratios while a model loads

KV_BYTES = 4 * 2**20
# "big" takes long enough to load that a resident model's steps can be counted during its load
BIG = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
       "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    sources = {"tiny": "tiny", "small": str(make_hf_model_dir("llama", tmp / "small")),
               "big": str(make_hf_model_dir("llama", tmp / "big", **BIG))}
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES))
    footprints = {name: engines.footprint_bytes(src) for name, src in sources.items()}
    budget = sum(footprints.values()) - min(footprints.values())  # any two fit, never all three
    huge = tmp / "huge"  # a member that could never fit: its size is known from config.json alone
    huge.mkdir()
    config = json.loads((Path(sources["small"]) / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps({**config, "hidden_size": 4096, "intermediate_size": 14336,
                                                  "num_hidden_layers": 32, "num_attention_heads": 32}))
    model_args = tuple(a for name, src in {**sources, "huge": str(huge)}.items()
                       for a in ("--model", f"{name}={src}"))
    with run_server("--memory-budget", str(budget), "--kv-cache-memory", str(KV_BYTES), "--min-residency-s", "0",
                    "--max-num-seqs", "8", "--load-timeout-s", "120", tmp_path=tmp, model_args=model_args) as server:
        server.footprints = footprints
        server.budget = budget
        yield server


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def evictions(server: ServerProcess) -> float:
    """Summed over models (ServerProcess.metrics drops the model label)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "flotilla_model_evictions_total")


def model_requests(server: ServerProcess, model: str, outcome: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "flotilla_model_requests_total" and s.labels == {"model": model, "outcome": outcome})


def model_states(server: ServerProcess) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]}


def rss_bytes(server: ServerProcess, samples: int = 5, every_s: float = 0.2) -> int:
    """The server's and its engine processes' RSS together, the least of a few samples: an unload in flight
    (its lane dropped, its process exiting) makes single readings swing."""
    readings = []
    for _ in range(samples):
        readings.append(sum(_rss(pid) for pid in (server.proc.pid, *_children(server.proc.pid))))
        time.sleep(every_s)
    return min(readings)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found + [g for c in found for g in _children(c)] if found else []


def _rss(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0  # exited between the listing and the reading
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:")), 0)


def ask(server: ServerProcess, model: str, max_tokens: int = 4) -> str:
    reply = client(server).chat.completions.create(model=model, max_tokens=max_tokens,
                                                   messages=[{"role": "user", "content": "Hello"}])
    assert reply.model == model and reply.choices[0].finish_reason in ("stop", "length")
    return reply.choices[0].message.content


def test_requests_cycling_through_three_models_all_complete_and_evictions_are_counted(pool):
    before = evictions(pool)
    for i in range(6):
        ask(pool, ("tiny", "small", "big")[i % 3])
    assert evictions(pool) - before >= 3  # from the third request on, every load evicts one model
    states = model_states(pool)
    assert sorted(states.values()) == ["available", "available", "loaded", "loaded"]  # huge never loads
    load = httpx.get(f"{pool.base_url}/flotilla/v1/load").json()
    assert load["memory_budget_bytes"] == pool.budget
    assert {m["name"]: m["state"] for m in load["models"]} == states
    assert pool.metric("flotilla_models_resident") == 2
    assert pool.metric("flotilla_model_load_seconds_count") >= 6 - 2


def test_a_model_that_can_never_fit_and_an_unknown_model_are_refused_at_once(pool):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    unknown = httpx.post(f"{pool.base_url}/v1/chat/completions", json={**body, "model": "nope"}, timeout=10)
    assert unknown.status_code == 404 and "tiny" in unknown.json()["error"]["message"]
    started = time.monotonic()
    huge = httpx.post(f"{pool.base_url}/v1/chat/completions", json={**body, "model": "huge"}, timeout=10)
    error = huge.json()["error"]
    assert huge.status_code == 400 and error["code"] == "model_too_large" and "--memory-budget" in error["message"]
    assert time.monotonic() - started < 5  # at once: nothing loaded, nothing evicted
    assert model_states(pool)["huge"] == "available"


def test_resident_models_keep_stepping_while_another_model_loads(pool):
    """Resident step rate while `big` loads >= 50% of the rate with no load going on, in the same run."""
    ask(pool, "small")
    ask(pool, "tiny")  # resident: small, tiny; big is evicted (least recently used)
    assert model_states(pool)["big"] == "available"
    arrivals: list[float] = []
    probes: list[tuple[float, float]] = []  # (sent, time to first token) of short requests to tiny
    stop = threading.Event()

    def stream() -> None:  # one long decode on tiny at a time: one token per engine step
        while not stop.is_set():
            chunks = client(pool).completions.create(model="tiny", prompt="The sea", max_tokens=2000, stream=True,
                                                     extra_body={"ignore_eos": True})
            for _ in chunks:
                arrivals.append(time.monotonic())
                if stop.is_set():
                    chunks.response.close()
                    return

    def probe() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            for _ in client(pool).completions.create(model="tiny", prompt="Hi", max_tokens=1, stream=True):
                probes.append((sent, time.monotonic() - sent))
                break
            time.sleep(0.1)

    window: list[float] = []

    def watch() -> None:  # the load window, as /v1/models shows it; polls through both windows alike
        while not stop.is_set():
            state = model_states(pool)["big"]
            if state == "loading" and not window:
                window.append(time.monotonic())
            if state == "loaded" and len(window) == 1:
                window.append(time.monotonic())
            time.sleep(0.05)

    threads = [threading.Thread(target=f) for f in (stream, probe, watch)]
    for t in threads:
        t.start()
    time.sleep(3.0)  # idle window: no load going on
    idle_end = time.monotonic()
    ask(pool, "big", max_tokens=1)  # evicts small (least recently used), loads big
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    assert len(window) == 2, "the load was never seen in the load report"
    load_start, load_end = window
    idle_start = idle_end - 2.0
    idle_rate = sum(idle_start <= t < idle_end for t in arrivals) / (idle_end - idle_start)
    load_rate = sum(load_start <= t < load_end for t in arrivals) / (load_end - load_start)
    idle_ttft = [d for s, d in probes if idle_start <= s < idle_end]
    load_ttft = [d for s, d in probes if load_start <= s < load_end]
    print(f"\nresident step rate: idle {idle_rate:.0f}/s, while big loads ({load_end - load_start:.2f} s) "
          f"{load_rate:.0f}/s = {load_rate / idle_rate:.0%}; TTFT of tiny: idle median "
          f"{statistics.median(idle_ttft) * 1000:.0f} ms, during the load "
          f"{statistics.median(load_ttft) * 1000 if load_ttft else float('nan'):.0f} ms ({len(load_ttft)} probes)")
    assert idle_rate > 0 and load_rate >= 0.5 * idle_rate


def test_five_load_unload_cycles_do_not_grow_rss(pool):
    """Each round loads and evicts every model once; RSS after round 5 is within 10% of one model of round 1."""
    order = ("tiny", "small", "big")
    for name in order:  # from here on, each request finds its model evicted one round before
        ask(pool, name, max_tokens=2)
    rss = []
    for _ in range(5):
        before = evictions(pool)
        for name in order:
            ask(pool, name, max_tokens=2)
        assert evictions(pool) - before == 3
        rss.append(rss_bytes(pool))
    growth = rss[-1] - rss[0]
    ask(pool, "tiny", max_tokens=2)
    ask(pool, "small", max_tokens=2)  # evicts big: tiny and small are resident
    freed = rss[-1] - rss_bytes(pool)  # reported: on CPU the allocator keeps freed pages for the next load
    big = pool.footprints["big"]
    print(f"\nRSS after each round (MiB): {[round(r / 2**20) for r in rss]}; growth {growth / 2**20:.1f} MiB, "
          f"one model (big) {big / 2**20:.0f} MiB; evicting big for tiny freed {freed / 2**20:.0f} MiB")
    assert growth < 0.1 * big


def test_a_client_that_leaves_while_its_model_loads_gives_up_its_claim(pool):
    ask(pool, "tiny")
    ask(pool, "small")  # big is not loaded
    assert model_states(pool)["big"] == "available"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{pool.base_url}/v1/completions", json={"model": "big", "prompt": "Hi", "max_tokens": 2},
                   timeout=0.5)
    deadline = time.monotonic() + 60
    while pool_model(pool, "big")["waiting"] or model_states(pool)["big"] != "loaded":
        assert time.monotonic() < deadline, "the claim was never given back, or the load never finished"
        time.sleep(0.2)
    assert model_requests(pool, "big", "client_gone") == 1
    ask(pool, "big")  # and the model serves the next request


def pool_model(server: ServerProcess, name: str) -> dict:
    report = httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=10).json()
    return next(m for m in report["models"] if m["name"] == name)
