"""Request classes and tenants through a real server: the header and field, 429 `tenant_limit` at a
tenant's cap, the batch share of the queue, preemption by class under pool pressure, and the metrics that
show each (docs/serving.md, "Priorities and tenants")."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server.http.server_process import ServerProcess, run_server

LONG = {"model": "tiny", "prompt": "a b c", "max_tokens": 1500, "ignore_eos": True, "stream": True}


def _wait_for(check, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s  # a hang-only deadline: the checks below read exact state
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class Streams:
    """Long streams held open on threads until `close`; each records its status."""

    def __init__(self, server: ServerProcess) -> None:
        self.server, self.statuses, self._threads = server, [], []
        self._stop = threading.Event()

    def start(self, headers: dict[str, str], body: dict = LONG) -> None:
        def run() -> None:
            with httpx.Client(timeout=120) as client, client.stream(
                    "POST", self.server.base_url + "/v1/completions", json=body, headers=headers) as r:
                self.statuses.append(r.status_code)
                for _ in r.iter_lines():
                    if self._stop.is_set():
                        return
        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with run_server("--max-num-seqs", "3", "--interactive-reserve-slots", "1", "--queue-depth-per-slot", "2",
                    "--tenant-max-running", "1", "--tenant-max-queued", "1", "--max-model-len", "2048",
                    tmp_path=tmp_path_factory.mktemp("classes")) as s:
        yield s


def test_a_bad_class_header_is_a_400_naming_it(server: ServerProcess) -> None:
    r = httpx.post(server.base_url + "/v1/completions", headers={"X-Flotilla-Class": "bulk"},
                   json={"model": "tiny", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 400
    assert "X-Flotilla-Class" in r.json()["error"]["message"] and "interactive, batch" in r.json()["error"]["message"]
    r = httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1,
                                                               "flotilla_class": "bulk"})
    assert r.status_code == 400 and "flotilla_class" in r.text


def test_a_tenant_past_its_caps_gets_429_tenant_limit_and_others_still_run(server: ServerProcess) -> None:
    streams = Streams(server)
    try:
        streams.start({"X-Flotilla-Tenant": "a"})  # runs (its cap: 1 running)
        _wait_for(lambda: server.metric("flotilla_class_requests_running", **{"class": "interactive"}) == 1,
                  "a's first request never ran")
        streams.start({"X-Flotilla-Tenant": "a"})  # waits: a is at its running cap (1 queued allowed)
        _wait_for(lambda: server.metric("flotilla_class_requests_waiting", **{"class": "interactive"}) == 1,
                  "a's second request never queued")
        r = httpx.post(server.base_url + "/v1/completions", headers={"X-Flotilla-Tenant": "a"},
                       json={"model": "tiny", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_limit"
        assert int(r.headers["Retry-After"]) >= 1 and "'a'" in r.json()["error"]["message"]
        r = httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2,
                                                                   "user": "b"})  # `user` names the tenant
        assert r.status_code == 200  # b runs beside a: a free slot, and b is under its own caps
        assert server.metric("flotilla_class_rejections_total", **{"class": "interactive", "tenant": "a",
                                                                   "reason": "tenant_limit"}) == 1
        assert server.metric("flotilla_rejections_total", reason="tenant_limit") == 1
    finally:
        streams.close()
    _wait_for(lambda: server.metric("flotilla_requests_running") == 0, "the streams never ended")


def test_batch_work_never_takes_the_reserved_slot_nor_the_whole_queue(server: ServerProcess) -> None:
    streams = Streams(server)
    try:
        for i in range(2):  # 2 of the 3 slots: the third is interactive's
            streams.start({"X-Flotilla-Class": "batch", "X-Flotilla-Tenant": f"batch-{i}"})
        _wait_for(lambda: server.metric("flotilla_class_requests_running", **{"class": "batch"}) == 2,
                  "the batch requests never ran")
        for i in range(4):  # the queue holds 2 x 3; batch may fill 2 x (3 - 1)
            streams.start({"X-Flotilla-Class": "batch", "X-Flotilla-Tenant": f"batch-q{i}"})
        _wait_for(lambda: server.metric("flotilla_class_requests_waiting", **{"class": "batch"}) == 4,
                  "the batch requests never queued")
        r = httpx.post(server.base_url + "/v1/completions", headers={"X-Flotilla-Class": "batch"},
                       json={"model": "tiny", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        r = httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200  # interactive: past the batch waiters, into the reserved slot
        assert server.metric("flotilla_class_requests_running", **{"class": "batch"}) == 2
    finally:
        streams.close()
    _wait_for(lambda: server.metric("flotilla_requests_running") == 0, "the streams never ended")


def test_a_dry_pool_preempts_batch_before_interactive(tmp_path) -> None:
    # 64 blocks of 16 positions: two sequences growing to ~1,006 tokens each run the pool dry while both run;
    # the interactive one, admitted last, would be the victim without classes
    with run_server("--max-num-seqs", "2", "--num-kv-blocks", "64", "--max-model-len", "1024",
                    "--interactive-reserve-slots", "0", tmp_path=tmp_path) as s:
        body = {"model": "tiny", "prompt": "a b c", "max_tokens": 1000, "ignore_eos": True}
        results: dict[str, httpx.Response] = {}

        def send(name: str, headers: dict[str, str]) -> None:
            results[name] = httpx.post(s.base_url + "/v1/completions", json=body, headers=headers, timeout=120)

        batch = threading.Thread(target=send, args=("batch", {"X-Flotilla-Class": "batch"}))
        batch.start()
        _wait_for(lambda: s.metric("flotilla_class_requests_running", **{"class": "batch"}) == 1, "batch never ran")
        interactive = threading.Thread(target=send, args=("interactive", {}))
        interactive.start()
        batch.join(120), interactive.join(120)
        assert results["batch"].status_code == results["interactive"].status_code == 200
        assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in results.values())
        assert s.metric("flotilla_class_preemptions_total", **{"class": "batch"}) >= 1
        assert s.metric("flotilla_class_preemptions_total", **{"class": "interactive"}) == 0
