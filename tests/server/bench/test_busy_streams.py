"""The busy streams of `flotilla-bench modes` hold the server's slots while a burst lands, and free them
when the block ends; a stream that ends too soon is reported, not measured as busy. Against a real server."""

from __future__ import annotations

import time
import urllib.request

import pytest
from flotilla_server.bench.busy_streams import BusyStreams, load, wait_idle
from flotilla_server.bench.kernel_clock import post
from flotilla_server.bench.tiny_server import tiny_server


def stream(max_tokens: int) -> bytes:
    return post("/v1/completions", {"model": "tiny", "prompt": "busy", "max_tokens": max_tokens,
                                    "ignore_eos": True, "stream": True})


@pytest.fixture(scope="module")
def port():
    with tiny_server("--max-num-seqs", "2", "--max-model-len", "2048") as server:
        yield server.port


def client_gone(port: int) -> float:
    """flotilla_requests_total{code="499"}: requests whose client left before their end."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("flotilla_requests_total{") and 'code="499"' in line)


def test_the_streams_hold_every_slot_until_the_block_ends_and_the_server_then_frees_them(port) -> None:
    left_before = client_gone(port)
    with BusyStreams(port, 2, stream(2000)) as streams:
        report = load(port)
        assert (report["running"], report["slots"]) == (2, 2)
    assert not streams.ended_early
    wait_idle(port)
    assert client_gone(port) - left_before == 2  # closed mid-stream, not run to their 2,000 tokens


def test_streams_that_end_inside_the_block_are_reported(port) -> None:
    with BusyStreams(port, 2, stream(8)) as streams:
        deadline = time.monotonic() + 30
        while load(port)["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the reader sees both ends within its 50 ms select
    assert streams.ended_early
