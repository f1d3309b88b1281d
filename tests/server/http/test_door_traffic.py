"""A request let in waits for a quiet door (http/door_traffic.py), on a real event loop: alone it goes on after
one turn; during a burst it goes on only after a turn with no arrival; a door that never goes quiet delays
it by at most the cap; one watcher serves every request waiting, and a request cancelled while it waits
leaves the others waiting.

The watcher sees a quiet turn and wakes the requests waiting; they run on the turn after it."""

from __future__ import annotations

import asyncio
import time

from flotilla_server.http.door_traffic import DoorTraffic


async def _turns_until_quiet(traffic: DoorTraffic, arrivals_per_turn: list[int]) -> tuple[int, int]:
    """Runs `until_quiet` while arrivals come on the loop's next turns (`arrivals_per_turn[i]` on turn i+1);
    returns (turns that passed before it returned, arrivals by then)."""
    turns = 0
    done = False

    def turn() -> None:
        nonlocal turns
        if done:
            return
        turns += 1
        for _ in range(arrivals_per_turn[turns - 1] if turns <= len(arrivals_per_turn) else 0):
            traffic.arrived()
        asyncio.get_running_loop().call_soon(turn)

    asyncio.get_running_loop().call_soon(turn)
    await traffic.until_quiet()
    done = True
    return turns, traffic.arrivals


def test_a_request_alone_goes_on_after_one_turn():
    turns, arrivals = asyncio.run(_turns_until_quiet(DoorTraffic(), []))
    assert (turns, arrivals) == (2, 0)  # the watcher's turn, then the request's


def test_a_request_let_in_during_a_burst_waits_for_the_turn_after_the_last_arrival():
    burst = [40, 3, 0, 25, 1]  # a quiet turn inside the burst (the third): the request goes on after it
    turns, arrivals = asyncio.run(_turns_until_quiet(DoorTraffic(), burst))
    assert (turns, arrivals) == (4, 68)
    steady = [5] * 6
    turns, arrivals = asyncio.run(_turns_until_quiet(DoorTraffic(), steady))
    assert (turns, arrivals) == (8, 30)


def test_a_door_that_never_goes_quiet_delays_a_request_by_the_cap_at_most():
    traffic = DoorTraffic(max_wait_s=0.05)

    async def scenario() -> float:
        stop = False

        def arrive() -> None:
            if not stop:
                traffic.arrived()
                asyncio.get_running_loop().call_soon(arrive)

        asyncio.get_running_loop().call_soon(arrive)
        start = time.monotonic()
        await traffic.until_quiet()
        stop = True
        return time.monotonic() - start

    waited_s = asyncio.run(scenario())
    assert 0.05 <= waited_s < 1.0, waited_s
    assert traffic.arrivals > 100  # arrivals came on every turn meanwhile


class LookedAtTraffic(DoorTraffic):
    """Counts how often the door's arrivals are read: once a turn by the watcher, whoever waits."""

    looks = 0

    @property  # type: ignore[override]
    def arrivals(self) -> int:
        self.looks += 1
        return self._arrivals

    @arrivals.setter
    def arrivals(self, value: int) -> None:
        self._arrivals = value


def test_one_watcher_serves_every_request_waiting_and_a_cancelled_one_leaves_the_others_waiting():
    """What made it one: 36 requests looking for themselves ran 36 task steps on every turn of a burst."""
    traffic = LookedAtTraffic()

    async def scenario() -> list[bool]:
        waiting = [asyncio.ensure_future(traffic.until_quiet()) for _ in range(36)]
        await asyncio.sleep(0)  # every request is waiting now
        for _ in range(3):  # three turns with arrivals, then quiet
            traffic._arrivals += 1
            await asyncio.sleep(0)
        waiting[0].cancel()
        await asyncio.wait(waiting, timeout=1.0)
        return [w.cancelled() for w in waiting]

    assert asyncio.run(scenario()) == [True] + [False] * 35  # the others went on once the door was quiet
    assert traffic.looks <= 12  # one watcher: a look or two a turn for all 36 (each looking for itself: 287)
