"""Restarting the operator in the middle of a scale-down window neither scales down at once nor
resets the window: the recommendations live in status.autoscaler, not in the process.

The model starts at 3 replicas with no load. Its first decision records 3 (the current size) and 1,
so the scale-down is due one window after that first decision. The operator is restarted 6 s into
the window: the scale-down must come at the window's end, not sooner, and not a window after the
new process' first decision.

Times come from what the test recorded (the Recorder's samples, the recommendations in status) and
from the operator's own lastScaleTime, never from clocks read after a blocking call, so a slow
start of the new process on a loaded machine cannot fail the test by itself; waits have deadlines
that only a hang reaches.
"""

from __future__ import annotations

import time

from e2e.conftest import SETTLE_S
from e2e.harness import Loop, Recorder, epoch, inference_model

NAME = "restart"
WINDOW_S = 20  # scaleDownStabilizationSeconds
RESTART_AT_S = 6  # into the window


def test_restart_mid_window_keeps_the_window(loop: Loop) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=3, minReplicas=1, maxReplicas=3,
                               scaleDownStabilizationSeconds=WINDOW_S))
    try:
        with Recorder(loop.k8s.url, NAME) as recorder:
            first = loop.wait(lambda: (loop.model(NAME).get("status") or {}).get("autoscaler", {}).get("recommendations"),
                              SETTLE_S, "a first decision")
            window_start = epoch(first[0]["time"])
            assert first[0]["replicas"] == 3, first  # the current size is remembered as evidence
            time.sleep(max(window_start + RESTART_AT_S - time.time(), 0))
            restarted = time.time()  # before stop(): the new process decides nothing before this
            assert restarted < window_start + WINDOW_S / 2, "too slow to restart mid-window"
            loop.restart_operator()
            loop.wait(lambda: loop.replicas(NAME) == 1, SETTLE_S, "scale-down")  # when: from lastScaleTime below
        # the operator's own record; status is written just after the scale, so it may lag the replica count
        down = epoch(loop.wait(lambda: loop.model(NAME)["status"]["autoscaler"].get("lastScaleTime"), SETTLE_S,
                               "the scale-down recorded in status"))
        # the new process' first decision; a reset window would end no earlier than a window after it
        after = [t for t, _ in recorder.recommendations() if t >= restarted]
        new_first = min(after, default=down)
        print(f"window start +{restarted - window_start:.1f}s restarted, +{new_first - window_start:.1f}s first "
              f"decision of the new process, +{down - window_start:.1f}s down")
        early = [s.replicas for s in recorder.samples if s.epoch_s < window_start + WINDOW_S - 0.5]
        assert early and set(early) == {3}, early  # held through the restart until the window ended
        assert down >= window_start + WINDOW_S - 0.5, "scaled down before the window ended"
        assert down < new_first + WINDOW_S, "the restart reset the window"
        downs = loop.events(NAME, "ScaleDown")
        assert downs and downs[0]["message"].startswith("3 -> "), downs
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers of the deleted model stopped")
