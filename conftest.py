"""Every test run: once collection has imported the test modules (torch, transformers, kopf, kubernetes, the
gateway, the simulator), freeze that heap out of the garbage collector's reach.

Why: the tests that time a server (429s within bounds, /healthz latency, TTFT) measure from this process.
Measured in `make test`'s serial pass, whose one process collects every test: a full collection of that
heap took 360-470 ms, and one landing inside tests/server/http/test_overload.py's burst made its median 429
read 452 ms against the usual 8-11 ms. Frozen objects are still freed by reference counting; only cycles
among them are never collected. The servers do the same for their own start-up heap
(server/flotilla_server/engine/startup_heap.py).
"""

from __future__ import annotations

import gc

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
