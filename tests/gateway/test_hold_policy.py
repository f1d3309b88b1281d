"""hold_policy.admit and releasable: every rule of docs/gateway.md, "Scale from zero", one row each."""

from __future__ import annotations

import pytest
from flotilla_gateway.hold_policy import (
    UNKNOWN_POD_ROOM,
    admit,
    pod_room,
    releasable,
    retry_after_s,
    wait_spent,
    wakes_again,
)
from flotilla_gateway.route_map import ModelRoute
from flotilla_gateway.routing import PodView

BASE = ModelRoute(name="m", namespace="ns", resource="m", replicas=1, max_held=3, max_wait_s=300.0)
READY = ModelRoute(**{**BASE.__dict__, "pods": ("10.0.0.1:8000",)})
ZERO = ModelRoute(**{**BASE.__dict__, "replicas": 0})
ZERO_OFF = ModelRoute(**{**ZERO.__dict__, "scaling_disabled": True})
DEGRADED = ModelRoute(**{**BASE.__dict__, "degraded": "InvalidSpec: bad"})
DEGRADED_SERVING = ModelRoute(**{**READY.__dict__, "degraded": "PromotionFailed: rolled back"})
POOL_ZERO = ModelRoute(**{**ZERO.__dict__, "pool": "shared"})
POOL_ZERO_OFF = ModelRoute(**{**POOL_ZERO.__dict__, "scaling_disabled": True})


@pytest.mark.parametrize(("route", "held", "draining", "action", "status", "wake"), [
    (READY, 0, False, "route", 0, False),
    (READY, 1, False, "hold", 0, False),  # newcomers queue behind held requests
    (BASE, 0, False, "hold", 0, False),  # pods still starting: hold, no wake
    (ZERO, 0, False, "hold", 0, True),  # at zero: hold and wake
    (POOL_ZERO, 0, False, "hold", 0, True),  # a member of a pool at zero: the same (the pool is woken)
    (POOL_ZERO_OFF, 0, False, "refuse", 503, False),
    (ZERO, 2, False, "hold", 0, True),
    (ZERO, 3, False, "refuse", 429, False),  # the hold queue is full
    (ZERO_OFF, 0, False, "refuse", 503, False),  # nothing will wake it
    (DEGRADED, 0, False, "refuse", 503, False),  # no ready pod: never held
    (DEGRADED_SERVING, 0, False, "route", 0, False),  # its ready pods still serve
    (READY, 0, True, "refuse", 503, False),
])
def test_admit(route: ModelRoute, held: int, draining: bool, action: str, status: int, wake: bool) -> None:
    decision = admit(route, held, draining)
    assert (decision.action, decision.status, decision.wake) == (action, status, wake)
    if decision.status in (429,) or decision.code == "draining":
        assert decision.retry_after_s is not None


def test_messages_say_what_to_do() -> None:
    assert "InvalidSpec: bad" in admit(DEGRADED, 0, False).message
    assert "autoscaling is off" in admit(ZERO_OFF, 0, False).message
    assert "kubectl scale" in admit(ZERO_OFF, 0, False).message
    pooled = admit(POOL_ZERO_OFF, 0, False).message
    assert "ModelPool shared" in pooled and "kubectl scale modelpool -n ns shared --replicas=1" in pooled
    spent = wait_spent(ZERO)
    assert (spent.status, spent.retry_after_s) == (503, 30)
    assert retry_after_s(ModelRoute(**{**ZERO.__dict__, "max_wait_s": 3.0})) == 3


@pytest.mark.parametrize(("route", "held", "wakes"), [
    (POOL_ZERO, 1, True), (ZERO, 1, True),  # held while its scaler is at zero
    (POOL_ZERO, 0, False), (READY, 1, False), (BASE, 1, False),  # nobody held, or not at zero
    (POOL_ZERO_OFF, 1, False), (ModelRoute(**{**ZERO.__dict__, "degraded": "x"}), 1, False),
])
def test_wakes_again(route: ModelRoute, held: int, wakes: bool) -> None:
    assert wakes_again(route, held) == wakes


@pytest.mark.parametrize(("pod", "room"), [
    (PodView("a"), UNKNOWN_POD_ROOM),  # never read: a small first batch
    (PodView("a", in_flight=3), UNKNOWN_POD_ROOM - 3),
    (PodView("a", slots=4, queue_capacity=32, load_age_s=0.1), 32),  # never more at once than its queue holds
    (PodView("a", slots=4, queue_capacity=32, running=4, waiting=26, load_age_s=0.1), 2),
    # a slot freed but its successor not yet admitted: the server's queue is still full, so no room
    (PodView("a", slots=4, queue_capacity=32, running=3, waiting=32, in_flight=35, load_age_s=0.1), 0),
    (PodView("a", slots=4, queue_capacity=32, in_flight=40, load_age_s=0.1), 0),
])
def test_pod_room(pod: PodView, room: int) -> None:
    assert pod_room(pod) == room


def test_releasable_never_exceeds_held_or_room() -> None:
    pods = [PodView("a", slots=2, queue_capacity=4, load_age_s=0.1), PodView("b", slots=2, queue_capacity=4,
                                                                           load_age_s=0.1, running=2, waiting=4)]
    assert releasable(pods, 20) == 4  # a: its queue of 4 at once; b: full
    assert releasable(pods, 2) == 2
    assert releasable([], 5) == 0
