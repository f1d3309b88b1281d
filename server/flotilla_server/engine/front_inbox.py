"""The engine process's side of several HTTP processes (`--http-processes`): one pipe each, one loop.

Why: with the engine in its own process, the HTTP side is no longer bound to the engine's interpreter, so
several HTTP processes can share the port and split a burst's parsing and refusals, and a stream load's SSE
encoding, across cores (docs/serving.md, "HTTP processes"). The in-process mode cannot do this.

Rules:
- the loop reads every pipe between steps, as it reads one: `wait` and `get` are the loop's Inbox;
- each request belongs to the HTTP process that added it: its admission, refusal and outputs go back there
  only, so no HTTP process ever sees another's tokens; a request leaves the map when its last choice
  finishes, when it is refused, or when its owner aborts it;
- every HTTP process gets the engine's stats after every turn (gauges and load reports read them, and the
  adapters served: a load through one HTTP process serves requests through all), and only the first gets
  the step records, so that the step histograms count each step once;
- an adapter load's or unload's answer goes back to the HTTP process that asked;
- `Shutdown` from one HTTP process, or its pipe closing, aborts its requests and drops its pipe, and is
  not a message for the loop: the others' requests go on. The loop gets Shutdown when no pipe is left.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from flotilla_server.engine.messages import (
    AbortRequest,
    AddRequest,
    EngineUpdate,
    LoadAdapter,
    Shutdown,
    UnloadAdapter,
)

log = logging.getLogger(__name__)


@dataclass
class _Owner:
    front: int
    open_choices: int


class FrontInbox:
    def __init__(self, conns: list[Connection]) -> None:
        self._conns: dict[int, Connection] = dict(enumerate(conns))
        self._owners: dict[str, _Owner] = {}
        self._callers: dict[str, int] = {}  # an adapter call's id -> the HTTP process waiting for its answer
        self._pending: deque[Any] = deque()  # messages for the loop, in the order they were read

    # --- the loop's Inbox ----------------------------------------------------------------------------

    def wait(self, timeout_s: float | None) -> bool:
        """True once a message for the loop is ready. A Shutdown or a closed pipe is handled here, not
        passed on: it makes aborts for the leaver's requests, and Shutdown only when no pipe is left."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._pending:
            if not self._conns:
                raise EOFError("every HTTP process is gone")
            by_conn = {conn: front for front, conn in self._conns.items()}
            left_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(by_conn), left_s)
            if not ready:
                return False
            for conn in ready:  # one message from each ready pipe per round: none starves the others
                self._receive(by_conn[conn])  # type: ignore[index]
        return True

    def get(self) -> Any:
        if not self._pending:
            self.wait(None)
        return self._pending.popleft()

    def _receive(self, front: int) -> None:
        try:
            message = self._conns[front].recv()
        except (EOFError, OSError):
            self._drop(front, "its pipe closed")
            return
        if isinstance(message, Shutdown):
            self._drop(front, "it shut down")
            return
        self._pending.append(self._track(front, message))

    def _track(self, front: int, message: Any) -> Any:
        # request ids are unique across HTTP processes (uuid4, http/routes): an abort names its sender's own
        if isinstance(message, AddRequest):
            self._owners[message.request_id] = _Owner(front, len(message.prompts) * message.params.n)
        elif isinstance(message, AbortRequest):
            self._owners.pop(message.request_id, None)
        elif isinstance(message, LoadAdapter | UnloadAdapter):
            self._callers[message.call_id] = front
        return message

    def _drop(self, front: int, why: str) -> None:
        self._conns.pop(front).close()
        orphans = [rid for rid, o in self._owners.items() if o.front == front]
        for rid in orphans:
            del self._owners[rid]
            self._pending.append(AbortRequest(rid))
        self._callers = {call: f for call, f in self._callers.items() if f != front}
        log.info("HTTP process %d left (%s); %d of its requests aborted", front, why, len(orphans))
        if not self._conns:
            self._pending.append(Shutdown())

    # --- the loop's send ------------------------------------------------------------------------------

    def send(self, update: EngineUpdate) -> None:
        """Each HTTP process gets its own requests' news and the shared stats."""
        first = min(self._conns, default=None)
        by_front = {f: EngineUpdate(update.stats, record=update.record if f == first else None) for f in self._conns}
        for rid in update.admitted:
            if (o := self._owners.get(rid)) is not None and o.front in by_front:
                by_front[o.front].admitted.append(rid)
        for rid, why in update.refused:
            o = self._owners.pop(rid, None)
            if o is not None and o.front in by_front:
                by_front[o.front].refused.append((rid, why))
        for out in update.outputs:
            o = self._owners.get(out.request_id)
            if o is None:
                continue
            if out.finished:
                o.open_choices -= 1
                if o.open_choices == 0:
                    del self._owners[out.request_id]
            if o.front in by_front:
                by_front[o.front].outputs.append(out)
        for reply in update.adapter_replies:
            caller = self._callers.pop(reply.call_id, None)
            if caller in by_front:
                by_front[caller].adapter_replies.append(reply)  # type: ignore[index]
        for front, part in by_front.items():
            with contextlib.suppress(OSError, ValueError):  # it is gone: the next read drops it
                self._conns[front].send(part)
