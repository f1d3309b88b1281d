"""Outcome accounting: exactly one status code and one rejection reason per request, and its latencies.

Whatever ends a request (finish, client gone, slow client, drain timeout, error), `Outcome.close` aborts the
engine request if it still runs, so its blocks are free before the next step, counts the outcome once, and
leaves the in-flight count (docs/architecture.md, "A request's path").
"""

from __future__ import annotations

import logging
import time

from flotilla_server.engine.client import TokenEvent
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.refusals import CLIENT_GONE
from flotilla_server.http.state import ServerState

log = logging.getLogger("flotilla.server")


class Outcome:
    """Counts exactly one status code and one rejection reason per request; aborts the engine request once."""

    def __init__(self, state: ServerState, request_id: str) -> None:
        self.state = state
        self.request_id = request_id
        self.code: int | None = None
        self.reason: str | None = None
        self.engine_done = False
        self.closed = False
        state.live.add(request_id)

    def finish(self, code: int, reason: str | None = None) -> None:
        """The first call wins: later ones (a disconnect after the last chunk) change nothing."""
        if self.code is None:
            self.code, self.reason = code, reason

    def close(self) -> None:
        """Idempotent: abort the engine request if it still runs, count the outcome, leave in-flight."""
        if self.closed:
            return
        self.closed = True
        state, rid = self.state, self.request_id
        if not self.engine_done:
            self.finish(CLIENT_GONE, "client_gone")
            state.engine.abort(rid, "client_gone")
        code, reason = self.code or CLIENT_GONE, self.reason
        slow = rid in state.slow_clients  # counted when the engine cut it off
        state.live.discard(rid)
        state.slow_clients.discard(rid)
        m = state.metrics
        m.count_request(CLIENT_GONE if slow else code)
        if slow:
            log.info("request %s: client read too slowly; cancelled (slow_client)", rid)
        elif reason is not None:
            m.count_rejection(reason)
            if reason == "client_gone":
                log.info("request %s: client went away; generation cancelled (499)", rid)
        state.leave()


class Timing:
    """Token counters and latency histograms of one request, fed each event as it is sent.

    TTFT is the request's first token, of any choice; inter-token latency is measured within each choice."""

    def __init__(self, state: ServerState, arrival_s: float, num_prompt_tokens: int,
                 params: SamplingParams | None = None) -> None:
        self.m = state.metrics
        self.params = params  # its class and tenant label the per-class TTFT
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens  # of every prompt
        self.first = True
        self.last_s: dict[int, float] = {}  # per choice
        self.prompt_counted = False

    def on_event(self, event: TokenEvent) -> None:
        n = len(event.token_ids)
        if not self.prompt_counted:
            self.m.prompt_tokens.labels(self.m.model).inc(self.num_prompt_tokens)
            self.prompt_counted = True
        if n == 0:
            return
        now = time.monotonic()
        if self.first:
            self.m.ttft.labels(self.m.model).observe(now - self.arrival_s)
            if self.params is not None:
                self.m.classes.observe_ttft(self.params, now - self.arrival_s)
            self.first = False
        elif event.index in self.last_s:
            self.m.itl.labels(self.m.model).observe(now - self.last_s[event.index])
        self.last_s[event.index] = now
        self.m.generation_tokens.labels(self.m.model).inc(n)

    def done(self) -> None:
        self.m.request_duration.labels(self.m.model).observe(time.monotonic() - self.arrival_s)
