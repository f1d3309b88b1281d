"""A request let in waits for a quiet door (http/door_traffic.py), on a real event loop: alone it goes on after
one turn; during a burst it goes on only after a turn with no arrival; a door that never goes quiet delays
it by at most the cap."""

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
    assert (turns, arrivals) == (1, 0)


def test_a_request_let_in_during_a_burst_waits_for_the_turn_after_the_last_arrival():
    burst = [40, 3, 0, 25, 1]  # a quiet turn inside the burst: the request goes on there
    turns, arrivals = asyncio.run(_turns_until_quiet(DoorTraffic(), burst))
    assert (turns, arrivals) == (3, 43)
    steady = [5] * 6
    turns, arrivals = asyncio.run(_turns_until_quiet(DoorTraffic(), steady))
    assert (turns, arrivals) == (7, 30)


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
