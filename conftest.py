"""Every test run: how `make test`'s concurrent pass groups the tests, and a frozen heap once collected.

Grouping (under pytest-xdist's `--dist loadfile`, as `make test` runs it): each test file is one unit of
work, so a module's server starts once; e2e/ is one unit, because its
tests share one session-scoped loop (emulated API, operator, Prometheus) that a second worker would start
again. The e2e unit goes first, on a worker of its own: it is the longest (~3 minutes) and mostly waits on
windows and ticks, so it overlaps the CPU-bound files instead of running after them. Then the files that hold a
`slow` test, so that a long file does not start last, then the rest, most tests first (as
`--loadscope-reorder` would); `make test` passes `--no-loadscope-reorder` so that this order holds.

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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `--dist loadfile`: each file one unit, and e2e/ one unit. (Not xdist's loadgroup: pytest-xdist 3.8
    marks a group by rewriting `item._nodeid`, which pytest 9 no longer reads, so its groups fall apart.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndTheLoop(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return E2E_GROUP if nodeid.startswith(f"{E2E_GROUP}/") else super()._split_scope(nodeid)

    return FilesAndTheLoop(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only a pytest-xdist worker's order reaches the scheduler
        return
    groups = {id(item): _group(item) for item in items}
    sizes = Counter(groups.values())
    slow = {groups[id(item)] for item in items if item.get_closest_marker("slow")}
    # the e2e unit first, then files marked slow (a one-test file of 40 s must not come last), then most tests
    # first; a stable sort keeps each file's own order
    items.sort(key=lambda item: (groups[id(item)] != E2E_GROUP, groups[id(item)] not in slow,
                                 -sizes[groups[id(item)]], groups[id(item)]))


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()
