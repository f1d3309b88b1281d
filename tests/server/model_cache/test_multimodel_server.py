"""A real multi-model flotilla-server on CPU: three small models, a memory budget that holds two, requests
that cycle through all three (docs/serving.md, "Multi-model mode"); a killed engine process; the pool
dashboard and the thrash alert over a real Prometheus scraping this server (docs/pools.md).

One server process serves every test here (start-up dominates on a shared CPU). The figures the step-rate
test measures (resident step rate idle and while another model loads, the TTFT rise) are printed; run
`pytest tests/server/model_cache/test_multimodel_server.py -s` to see them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.engine_processes import LOAD_NICE, EngineProcesses
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.dashboard_queries import load_dashboards
from tests.chart.render import CHART
from tests.server.http.server_process import ServerProcess, run_server
from tests.support.dashboard_eval import failing_queries
from tests.support.hf_models import make_hf_model_dir
from tests.support.prometheus import RealPrometheus, Target

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
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []  # exited meanwhile
    for task in tasks:
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


def test_a_model_is_loaded_when_asked_without_a_request(pool):
    """POST /flotilla/v1/models/NAME/load: what the operator's demotion of an adaptive model sends a pool."""
    url = f"{pool.base_url}/flotilla/v1/models/{{}}/load"
    unknown = httpx.post(url.format("nope"), timeout=10)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "name"
    huge = httpx.post(url.format("huge"), timeout=10)
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "model_too_large"
    name = next(n for n, state in model_states(pool).items() if state == "available" and n != "huge")
    asked = httpx.post(url.format(name), timeout=10)
    assert asked.status_code == 202 and asked.json() == {"model": name, "state": "loading"}
    deadline = time.monotonic() + 120
    while model_states(pool)[name] != "loaded":
        assert time.monotonic() < deadline, f"{name} was not loaded within 120 s of being asked"
        time.sleep(0.2)
    again = httpx.post(url.format(name), timeout=10)
    assert again.status_code == 200 and again.json()["state"] == "loaded"
    ask(pool, name)  # its lane serves at once


@pytest.mark.serial  # a step-rate ratio: run alone
def test_resident_models_keep_stepping_while_another_model_loads(pool):
    """While other models load, the resident model's engine steps at >= 50% of its rate with no load going on,
    in the same run. Three loads (big, small, big again), each between idle windows, pooled: a co-tenant's
    burst on a shared box then moves one window, not the comparison. Steps are the engine's own count
    (/metrics), sampled every 0.1 s. The loading thread runs niced (watched every few ms: a load lasts a few
    tenths of a second, most of it before the niced thread exists); once loaded, no engine thread is. The
    TTFT rise is printed."""
    ask(pool, "small")
    ask(pool, "tiny")  # resident: small, tiny; big is evicted (least recently used)
    assert model_states(pool)["big"] == "available"
    samples: list[Sample] = []
    probes: list[tuple[float, float]] = []  # (sent, time to first token) of short requests to tiny
    highest_nice = [0]  # of any engine thread, at any time
    stop = threading.Event()

    def stream() -> None:  # one long decode on tiny at a time: one engine step per token
        while not stop.is_set():
            chunks = client(pool).completions.create(model="tiny", prompt="The sea", max_tokens=2000, stream=True,
                                                     extra_body={"ignore_eos": True})
            for _ in chunks:
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

    def sample() -> None:  # the same requests and /proc reads through every window
        while not stop.is_set():
            text = httpx.get(f"{pool.base_url}/metrics", timeout=10).text
            steps, loading = 0.0, False
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "flotilla_step_duration_seconds_count" and s.labels["model"] == "tiny":
                        steps = s.value
                    if s.name == "flotilla_model_state" and s.labels["state"] == "loading" and s.value == 1:
                        loading = True
            samples.append(Sample(time.monotonic(), steps, loading))
            time.sleep(0.1)

    def watch_nices() -> None:
        while not stop.is_set():
            highest_nice[0] = max(highest_nice[0], *engine_thread_nices(pool), 0)
            time.sleep(0.005)

    threads = [threading.Thread(target=f) for f in (stream, probe, sample, watch_nices)]
    for t in threads:
        t.start()
    time.sleep(IDLE_WINDOW_S + 0.5)  # the stream is under way
    for name in ("big", "small", "big"):  # each evicts the other idle model (tiny is busy), then loads
        ask(pool, name, max_tokens=1)
        time.sleep(IDLE_WINDOW_S + 0.2)
    stop.set()
    for t in threads:
        t.join(30)
    loads = load_windows(samples)
    assert loads, "no load was seen in /metrics"
    idles = [(start - IDLE_WINDOW_S, start) for start, _ in loads] + [(loads[-1][1], loads[-1][1] + IDLE_WINDOW_S)]
    idle, during = pooled_step_rate(samples, idles), pooled_step_rate(samples, loads)
    idle_ttft = [d for s, d in probes if any(a <= s < b for a, b in idles)]
    load_ttft = [d for s, d in probes if any(a <= s < b for a, b in loads)]
    print(f"\nresident step rate: idle {idle:.0f}/s, while {len(loads)} loads ran "
          f"({sum(b - a for a, b in loads):.2f} s) {during:.0f}/s = {during / idle:.0%}; TTFT of tiny: idle "
          f"median {statistics.median(idle_ttft) * 1000:.0f} ms, during the loads "
          f"{statistics.median(load_ttft) * 1000 if load_ttft else float('nan'):.0f} ms ({len(load_ttft)} probes); "
          f"highest nice of an engine thread {highest_nice[0]}")
    assert idle > 0 and during >= 0.5 * idle
    assert highest_nice[0] == LOAD_NICE  # a loading thread
    assert max(engine_thread_nices(pool)) == 0  # every engine steps at normal priority once loaded


IDLE_WINDOW_S = 2.0


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic seconds
    steps: float  # tiny's engine steps so far
    loading: bool  # some model was loading


def load_windows(samples: list[Sample]) -> list[tuple[float, float]]:
    """(first sample loading, first sample not loading after it) for each run of loading samples."""
    windows, start = [], None
    for x in samples:
        if x.loading and start is None:
            start = x.t
        elif not x.loading and start is not None:
            windows.append((start, x.t))
            start = None
    return windows


def pooled_step_rate(samples: list[Sample], windows: list[tuple[float, float]]) -> float:
    """Steps per second over all the windows together, each measured between its first and last sample;
    a window with fewer than two samples counts nothing."""
    steps, seconds = 0.0, 0.0
    for start, end in windows:
        inside = [x for x in samples if start <= x.t <= end]
        if len(inside) >= 2:
            steps += inside[-1].steps - inside[0].steps
            seconds += inside[-1].t - inside[0].t
    assert seconds > 0, f"no window of {windows} held two samples"
    return steps / seconds


def engine_thread_nices(server: ServerProcess) -> list[int]:
    """The nice value of every thread of every engine process (the server's descendants but itself)."""
    nices = []
    for pid in _children(server.proc.pid):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # exited meanwhile
        for task in tasks:
            try:
                nices.append(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
            except (OSError, IndexError, ValueError):
                continue
    return nices


def test_five_load_unload_cycles_do_not_grow_rss(pool):
    """Each round loads and evicts every model once; RSS grows by less than 5% of one model a round.

    Two rounds come first, unmeasured: after the first, each request finds its model evicted one round
    before; the second lets the allocator settle (a clean-clone CI run grew 5 MiB from its first measured
    round to its second and not at all after: [1379, 1384, 1385, 1385, 1385] MiB). A leak grows every round,
    so the bound is on the least-squares slope over five rounds, not on two readings: single readings wander
    by +-3 MiB (2026-12-05: [1389, 1384, 1385, 1390, 1388], and a first-to-last growth of 5.7 MiB failed the
    old 10%-of-a-model bound of 4.1 MiB once in two runs). Over five rounds that noise moves the slope by
    about 0.6 MiB a round; a leak of 5% of the model (2 MiB) a round is caught."""
    order = ("tiny", "small", "big")
    for _ in range(2):
        for name in order:
            ask(pool, name, max_tokens=2)
    rss = []
    for _ in range(5):
        before = evictions(pool)
        for name in order:
            ask(pool, name, max_tokens=2)
        assert evictions(pool) - before == 3
        rss.append(rss_bytes(pool))
    growth = rss[-1] - rss[0]
    slope_per_round = statistics.linear_regression(range(len(rss)), rss).slope
    ask(pool, "tiny", max_tokens=2)
    ask(pool, "small", max_tokens=2)  # evicts big: tiny and small are resident
    freed = rss[-1] - rss_bytes(pool)  # reported: on CPU the allocator keeps freed pages for the next load
    big = pool.footprints["big"]
    print(f"\nRSS after each round (MiB): {[round(r / 2**20) for r in rss]}; growth {growth / 2**20:.1f} MiB, "
          f"slope {slope_per_round / 2**20:.2f} MiB a round, one model (big) {big / 2**20:.0f} MiB; evicting big for "
          f"tiny freed {freed / 2**20:.0f} MiB")
    assert slope_per_round < 0.05 * big, f"RSS grows {slope_per_round / 2**20:.1f} MiB a round: {rss}"


def test_a_client_that_leaves_while_its_model_loads_gives_up_its_claim(pool):
    ask(pool, "tiny")
    ask(pool, "small")  # big is not loaded
    assert model_states(pool)["big"] == "available"
    body = json.dumps({"model": "big", "prompt": "Hi", "max_tokens": 2}).encode()
    url = httpx.URL(pool.base_url)
    with socket.create_connection((url.host, url.port), timeout=10) as sock:  # to leave at a moment of our choosing
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while (state := model_states(pool)["big"]) != "loading":  # its load takes an eviction and a load
            assert state == "available", "the load finished before the client could leave"
            assert time.monotonic() < deadline, "the load never started"
    deadline = time.monotonic() + 60
    while pool_model(pool, "big")["waiting"] or model_states(pool)["big"] != "loaded":
        assert time.monotonic() < deadline, "the claim was never given back, or the load never finished"
        time.sleep(0.2)
    assert model_requests(pool, "big", "client_gone") == 1
    ask(pool, "big")  # and the model serves the next request


def pool_model(server: ServerProcess, name: str) -> dict:
    report = httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=10).json()
    return next(m for m in report["models"] if m["name"] == name)


def test_a_killed_engine_fails_its_requests_and_its_model_is_loaded_again(pool):
    """SIGKILL one model's engine process: its requests end with a 5xx engine_error at once (none hangs), the
    model is `available` again with its memory out of the budget, the death is counted and logged, and the
    next request loads it again in a new process."""
    ask(pool, "tiny")
    engine = int(re.findall(r"model tiny loaded in .* engine process (\d+)", pool.log())[-1])
    free_before = httpx.get(f"{pool.base_url}/flotilla/v1/load", timeout=10).json()["memory_free_bytes"]
    body = {"model": "tiny", "prompt": "The engine dies", "max_tokens": 1500, "ignore_eos": True}
    answers: dict[str, object] = {}
    first_token = threading.Event()

    def whole() -> None:
        answers["json"] = httpx.post(f"{pool.base_url}/v1/completions", json=body, timeout=60)

    def streamed() -> None:
        with httpx.stream("POST", f"{pool.base_url}/v1/completions", json={**body, "stream": True},
                          timeout=60) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    first_token.set()
        answers["stream"] = lines[-2:]

    threads = [threading.Thread(target=f) for f in (whole, streamed)]
    for t in threads:
        t.start()
    assert first_token.wait(60)
    deadline = time.monotonic() + 30
    while pool_model(pool, "tiny")["running"] < 2:
        assert time.monotonic() < deadline, "both requests never ran"
        time.sleep(0.05)
    killed_s = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request hung after its engine died"
    assert time.monotonic() - killed_s < 10
    whole_answer = answers["json"]
    assert whole_answer.status_code == 500, whole_answer.text
    error = whole_answer.json()["error"]
    assert error["code"] == "engine_error" and "stopped before this request finished" in error["message"]
    ending = answers["stream"]
    assert '"engine_error"' in ending[0] and ending[1] == "data: [DONE]", ending
    deadline = time.monotonic() + 10
    while model_states(pool)["tiny"] != "available":
        assert time.monotonic() < deadline, "the dead model never went back to available"
        time.sleep(0.05)
    load = httpx.get(f"{pool.base_url}/flotilla/v1/load", timeout=10).json()
    assert load["memory_free_bytes"] == free_before + pool.footprints["tiny"]
    text = httpx.get(f"{pool.base_url}/metrics", timeout=10).text
    deaths = {s.labels["model"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "flotilla_model_engine_deaths_total"}
    assert deaths["tiny"] == 1 and deaths.get("big", 0) == 0  # big has a series once it has loaded
    assert "model tiny: its engine stopped" in pool.log()
    ask(pool, "tiny")  # loaded again, in a new process
    assert int(re.findall(r"model tiny loaded in .* engine process (\d+)", pool.log())[-1]) != engine


RULES = CHART / "files" / "prometheus-rules.yaml"
POOL_LABELS = {"namespace": "team-a", "pool": "shared", "pod": "shared-0"}  # as a pool's ServiceMonitor adds them
# Panels the cycling below must move, not merely create.
POOL_MUST_BE_NONZERO = {"Resident models per pod", "Evictions/s by model", "Load time", "Loads/s"}


def test_the_pool_dashboard_and_the_thrash_alert_evaluate_against_a_real_prometheus(pool):
    """A real Prometheus scrapes this server, labelled as a pool pod, and loads the chart's alert rules. While
    requests cycle three models through a budget for two, every panel of the pool dashboard has data, and
    FlotillaModelPoolThrashing's condition holds (pending: it needs 15 minutes to fire)."""
    dashboard = load_dashboards()["flotilla-pool.json"]
    stop = threading.Event()

    def thrash() -> None:  # each request evicts the least recently used of the other two models
        while not stop.is_set():
            for name in ("tiny", "small", "big"):
                ask(pool, name, max_tokens=1)

    with RealPrometheus(scrape_interval_s=1.0, rule_files=[RULES]) as prometheus:
        prometheus.set_targets([Target(pool.base_url.removeprefix("http://"), POOL_LABELS)])
        prometheus.wait_for("sum(flotilla_models_resident)")
        cycling = threading.Thread(target=thrash)
        cycling.start()
        try:
            deadline = time.monotonic() + 60
            failures, pending = ["not evaluated yet"], []
            while (failures or not pending) and time.monotonic() < deadline:
                time.sleep(2)  # scrapes and rule evaluations
                failures = failing_queries(prometheus, [dashboard], POOL_MUST_BE_NONZERO)
                pending = prometheus.query('ALERTS{alertname="FlotillaModelPoolThrashing"}')
        finally:
            stop.set()
            cycling.join(60)
        assert not failures, "pool dashboard queries without data:\n" + "\n".join(failures)
        assert [labels["alertstate"] for labels, _ in pending] == ["pending"]
        assert {k: pending[0][0][k] for k in POOL_LABELS} == POOL_LABELS
