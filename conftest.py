"""Every test run: how `make test`'s concurrent pass groups the tests, and a frozen heap once collected.

Grouping (only under pytest-xdist's `--dist loadgroup`, as `make test` runs it): each test file is one unit
of work, as `--dist loadfile` would make it, so a module's server starts once; e2e/ is one unit, because its
tests share one session-scoped loop (emulated API, operator, Prometheus) that a second worker would start
again. The e2e unit goes first, on a worker of its own: it is the longest (~3 minutes) and mostly waits on
windows and ticks, so it overlaps the CPU-bound files instead of running after them. The other files follow
in the order `--loadscope-reorder` would give (most tests first); `make test` passes
`--no-loadscope-reorder` so that this order holds.

The frozen heap: once collection has imported the test modules (torch, transformers, kopf, kubernetes, the
gateway, the simulator), freeze that heap out of the garbage collector's reach. Why: the tests that time a
server (429s within bounds, /healthz latency, TTFT) measure from this process. Measured in `make test`'s
serial pass, whose one process collects every test: a full collection of that heap took 360-470 ms, and one
landing inside tests/server/http/test_overload.py's burst made its median 429 read 452 ms against the usual
8-11 ms. Frozen objects are still freed by reference counting; only cycles among them are never collected.
The servers do the same for their own start-up heap (server/flotilla_server/engine/startup_heap.py).
"""

from __future__ import annotations

import gc
from collections import Counter
from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent / "e2e"
E2E_GROUP = "e2e"


def _group(item: pytest.Item) -> str:
    path = Path(item.path).resolve()
    return E2E_GROUP if E2E_DIR in path.parents else str(path.relative_to(Path(__file__).resolve().parent))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "dist", None) != "loadgroup":
        return
    groups = {id(item): _group(item) for item in items}
    sizes = Counter(groups.values())
    # the e2e unit first, then most tests first; a stable sort keeps each file's own order
    items.sort(key=lambda item: (groups[id(item)] != E2E_GROUP, -sizes[groups[id(item)]], groups[id(item)]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)]))


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
