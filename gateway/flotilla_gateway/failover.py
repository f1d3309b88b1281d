"""When a failed attempt is tried again on another pod: the retry rule, pure (docs/gateway.md, "Failover").

Why the gateway holds the status line until the first body byte: until then nothing has reached the client, so
another pod can answer the request as if the first had never been asked; once a byte is out, the answer is the
first pod's, and a failure can only end the stream (with an SSE error event, proxy.Relay). The servers take a
request on only one pod at a time, so a retried request costs the failed pod nothing more: its connection is
closed, and it cancels the request and frees its KV.

Rules, in order:
1. a failure that says nothing about other pods is not retried: a 4xx other than 429 (the request itself is
   wrong), a 5xx the pod chose (500, 501, ...), and a 504 (the pod took the request and timed out: another would
   likely time out too, at twice the cost);
2. retryable: connect refused, reset or timed out, or the connection dropped before the first body byte; 503
   (draining, or a model that cannot load on that pod); 502 from the pod; the pod gone from the endpoints while
   the gateway waited for its first byte; and 429 when another untried pod reports room;
3. never past `max_retries` retries (0 turns retrying off), past the request's `deadline_s` since it arrived,
   or with no untried pod left.
"""

from __future__ import annotations

from dataclasses import dataclass

# Failure kinds (the `reason` label of flotilla_gateway_upstream_retries_total)
CONNECT_ERROR = "connect_error"  # refused, reset, timed out connecting
DROPPED_BEFORE_BODY = "dropped_before_body"  # headers came, then the connection ended before a body byte
POD_GONE = "pod_gone"  # the pod left the endpoints while the gateway waited for its first byte
RETRYABLE_STATUSES = (502, 503)
THROTTLED = 429


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 2  # attempts after the first; 0: never retried
    deadline_s: float = 30.0  # no retry starts later than this after the request arrived

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"--max-retries must be >= 0 (0 turns retrying off), got {self.max_retries}")
        if not self.deadline_s > 0:
            raise ValueError(f"--retry-deadline-s must be above 0, got {self.deadline_s}")


@dataclass(frozen=True)
class Attempt:
    """What one attempt ended with, and what the request has left."""

    failure: str | int  # a failure kind above, or the pod's status code
    retries_done: int  # retries already sent (0 after the first attempt)
    elapsed_s: float  # since the request arrived at the gateway
    untried_pods: int  # the model's ready pods not tried yet for this request
    room_elsewhere: bool = False  # an untried pod reports room (for a 429)


@dataclass(frozen=True)
class Verdict:
    retry: bool
    reason: str  # the failure, as a metric label; or why it is not retried


def retryable(failure: str | int, room_elsewhere: bool) -> bool:
    if failure in (CONNECT_ERROR, DROPPED_BEFORE_BODY, POD_GONE) or failure in RETRYABLE_STATUSES:
        return True
    return failure == THROTTLED and room_elsewhere


def decide_retry(attempt: Attempt, policy: RetryPolicy) -> Verdict:
    """Whether to send the request to another pod after `attempt` (the module's docstring lists the rules)."""
    label = str(attempt.failure)
    if not retryable(attempt.failure, attempt.room_elsewhere):
        return Verdict(False, f"not_retryable:{label}")
    if attempt.retries_done >= policy.max_retries:
        return Verdict(False, f"retries_spent:{label}")
    if attempt.elapsed_s >= policy.deadline_s:
        return Verdict(False, f"deadline_spent:{label}")
    if attempt.untried_pods <= 0:
        return Verdict(False, f"no_other_pod:{label}")
    return Verdict(True, label)
