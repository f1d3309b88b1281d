"""One whole loop (emulator, operator, Prometheus, pod runner) shared by the autoscaling scenarios.

Sharing saves the start-up of every component per test. Each scenario uses its own InferenceModel
and deletes it at the end, so the pod runner stops its servers before the next scenario begins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import Loop, whole_loop

AUTOSCALE_INTERVAL_S = 2.0  # --autoscale-interval-s for the whole suite
SERVER_START_S = 120.0  # a flotilla-server process importing torch and becoming ready on a shared, busy machine
# Rule: a wait's deadline only catches a hang; what a test asserts about timing it computes from the times of
# events recorded as they happened (status times, Events, Prometheus samples, the gateway's access log), never
# from when a wait returned. SETTLE_S is the deadline of such a wait.
SETTLE_S = 120.0
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under e2e/ is marked `e2e` (`pytest -m "not e2e"` skips the whole loop). `make test` runs them
    on one worker of its concurrent pass (the root conftest.py groups them), beside the CPU-bound files: their
    checks read when things happened from the operator's and Prometheus' records, and their waits' deadlines
    only catch a hang, so a busy machine slows them without failing them."""
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    with whole_loop(tmp_path_factory.mktemp("loop"), autoscale_interval_s=AUTOSCALE_INTERVAL_S) as running:
        yield running
