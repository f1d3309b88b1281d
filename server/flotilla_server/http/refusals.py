"""What a refused or cut-short request is told: one message, status and headers per rejection reason.

Written once and used by both places that refuse (the load shedder at the door, before the body is read;
admission, after it), and by both renderings of an aborted generation (one JSON body, an SSE error chunk).
Every message says what the client should do next (docs/architecture.md, "Design rules: admission").
"""

from __future__ import annotations

import math

CLIENT_GONE = 499  # nginx's code for "client closed request"; never counted as a server error

DRAINING_MESSAGE = "The server is draining for shutdown: retry against another replica."
DRAINING_HEADERS = {"Retry-After": "1", "Connection": "close"}


def retry_after_s(queue_timeout_s: float) -> int:
    """The Retry-After value for both kinds of 429: ceil(queue_timeout_s), at least 1."""
    return max(1, math.ceil(queue_timeout_s))


def queue_full_message(depth: int, retry_s: int) -> str:
    return f"The server's queue is full ({depth} waiting): retry after {retry_s} s or send to another replica."


def queue_timeout_message(queue_timeout_s: float, retry_s: int) -> str:
    return (f"The request waited longer than {queue_timeout_s:g} s for a slot: "
            f"retry after {retry_s} s or send to another replica.")


def tenant_limit_message(tenant: str, max_queued: int, retry_s: int) -> str:
    who = f"tenant {tenant!r}" if tenant else "requests that name no tenant"
    return (f"Too many requests of {who} are waiting ({max_queued}, the server's --tenant-max-queued): "
            f"retry after {retry_s} s, or send fewer at once.")


def infeasible_message(why: str) -> str:
    return f"This request can never fit: {why}."  # `why` already says what to change, once


def abort_message(reason: str | None) -> tuple[str, str]:
    """(message, error code) for a generation the engine aborted."""
    if reason == "drain_timeout":
        return ("The server shut down before this request finished (--drain-timeout-s passed): "
                "retry against another replica."), "draining"
    if reason == "shutdown":  # a second SIGTERM during the drain
        return ("The server shut down before this request finished (told to stop at once): "
                "retry against another replica."), "draining"
    if reason == "slow_client":
        return ("The client read the stream too slowly and its buffer filled: the request was cancelled. "
                "Read the stream as it arrives."), "slow_client"
    if reason == "adapter_not_served":  # unloaded between the name's check and the engine (messages.py)
        return ("The LoRA adapter this request names was unloaded before the request started: send it to a model "
                "this server serves (see GET /v1/models)."), "model_not_found"
    if reason == "engine_error":  # its process died or its loop failed (a multi-model server reloads the model)
        return ("The engine serving this model stopped before this request finished (its process died or "
                "failed): retry the request."), "engine_error"
    return f"Generation was aborted ({reason or 'unknown reason'}).", reason or "aborted"
