"""What a request reserves (rate_limit_cost.py) and what its answer used (rate_limit_usage.py), one rule of
docs/gateway.md ("Rate limits") per row; and the gate (rate_limit_gate.py) settling one with the other."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from flotilla_gateway.keys import Tenant
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.rate_limit import RateLimit
from flotilla_gateway.rate_limit_cost import RequestCost, request_cost
from flotilla_gateway.rate_limit_gate import NO_CHARGE, RateLimits
from flotilla_gateway.rate_limit_usage import MAX_BODY_BYTES, UsageMeter

CHAT = {"model": "tiny", "messages": [{"role": "system", "content": "x" * 40},
                                      {"role": "user", "content": [{"type": "text", "text": "y" * 38},
                                                                   {"type": "image_url", "image_url": {"url": "u"}}]}]}


@pytest.mark.parametrize(("body", "token_burst", "cost"), [
    ({**CHAT, "max_tokens": 50}, None, RequestCost(20, 50, True)),  # 78 characters: 20 tokens
    ({**CHAT, "max_completion_tokens": 50, "n": 3}, None, RequestCost(20, 150, True)),
    ({**CHAT, "max_tokens": None}, None, RequestCost(20, 1024, False)),  # unstated: chat reserves 1024
    (CHAT, 600, RequestCost(20, 580, False)),  # lowered to what the burst leaves after the prompt
    (CHAT, 10, RequestCost(20, 1, False)),  # the prompt alone is too large: at least 1
    ({**CHAT, "n": 2}, 5000, RequestCost(20, 2048, False)),
    ({"model": "m", "prompt": "abcdefghi"}, None, RequestCost(3, 16, False)),  # completions: the server's 16
    ({"model": "m", "prompt": "abcd", "max_tokens": 7, "n": 2}, None, RequestCost(1, 14, True)),
    ({"model": "m", "prompt": ["abcd", "efgh"], "max_tokens": 5}, None, RequestCost(2, 10, True)),  # each prompt
    ({"model": "m", "prompt": [1, 2, 3, 4, 5]}, None, RequestCost(5, 16, False)),  # token ids count exactly
    ({"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 4}, None, RequestCost(3, 8, True)),
    ({"model": "m", "prompt": "abcd", "max_tokens": "lots", "n": True}, None, RequestCost(1, 16, False)),
])
def test_request_cost(body: dict[str, Any], token_burst: float | None, cost: RequestCost) -> None:
    assert request_cost(body, token_burst) == cost


def sse(*payloads: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (p.encode() if isinstance(p, str) else json.dumps(p).encode()) + b"\n\n"
                    for p in payloads)


TOKEN = {"choices": [{"index": 0, "delta": {"content": "t"}}]}
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def meter(status: int, content_type: str, body: bytes, chunk_bytes: int = 7) -> int:
    """The tokens a meter counts for `body`, fed in chunks of `chunk_bytes` (lines split anywhere)."""
    m = UsageMeter(prompt_tokens=5)
    m.start(status, content_type)
    for i in range(0, len(body), chunk_bytes):
        m.feed(body[i:i + chunk_bytes])
    return m.used_tokens()


@pytest.mark.parametrize(("status", "content_type", "body", "used"), [
    (200, "application/json", json.dumps({"choices": [], "usage": USAGE}).encode(), 10),
    (200, "application/json", json.dumps({"usage": {"prompt_tokens": 4, "completion_tokens": 2}}).encode(), 6),
    (200, "application/json", json.dumps({"choices": [{"message": {"content": "x" * 9}}]}).encode(), 5 + 3),
    (200, "application/json", json.dumps({"choices": [{"text": "x" * 8}, {"text": "y"}]}).encode(), 5 + 3),
    (200, "application/json", b"not json at all!", 5 + 4),
    (200, "text/event-stream; charset=utf-8", sse(TOKEN, TOKEN, TOKEN, "[DONE]"), 5 + 3),  # one per event
    (200, "text/event-stream", sse({**TOKEN, "usage": None}, {"choices": [], "usage": USAGE}, "[DONE]"), 10),
    (200, "text/event-stream", b"data: " + json.dumps(TOKEN).encode(), 5 + 1),  # ends without a newline
    (400, "application/json", json.dumps({"error": {"message": "bad"}, "usage": USAGE}).encode(), 0),
    (503, "text/event-stream", sse(TOKEN), 0),  # not 2xx: nothing used
    (0, "", b"", 0),  # no answer at all
])
def test_usage_meter(status: int, content_type: str, body: bytes, used: int) -> None:
    assert meter(status, content_type, body) == used
    assert meter(status, content_type, body, chunk_bytes=len(body) or 1) == used


def test_a_huge_plain_answer_is_counted_by_its_size() -> None:
    body = b'{"choices": [{"text": "' + b"x" * MAX_BODY_BYTES + b'"}]}'
    assert meter(200, "application/json", body, chunk_bytes=1 << 20) == 5 + (len(body) + 3) // 4


def test_an_answer_settles_its_reservation_with_its_usage_and_shows_the_headers() -> None:
    gate = RateLimits(GatewayMetrics().rate_limited, clock=lambda: 0.0)
    tenant = Tenant("t", frozenset({"tiny"}), None, RateLimit(tokens_per_min=1000), key="sk-t")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 90}
    charge = gate.admit(tenant, body)  # reserves 10 + 90
    bucket = gate.limiter.buckets[("sk-t", "tokens")]
    assert bucket.level == 900

    async def answer(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"x-ratelimit-limit-tokens", b"5")]})
        await send({"type": "http.response.body", "body": json.dumps({"usage": USAGE | {"total_tokens": 30}}).encode()})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(charge.metered(answer)({}, None, send))
    assert bucket.level == 970  # the 70 tokens it did not use came back
    headers = sent[0]["headers"]
    assert [v for k, v in headers if k == b"x-ratelimit-limit-tokens"] == [b"1000"]  # the pod's header replaced
    assert (b"x-ratelimit-remaining-tokens", b"900") in headers  # as it stood after the reservation
    assert charge.settle() == 0  # once only

    unanswered = gate.admit(tenant, body)  # a request that got no answer (a 404, a hold timed out, a 502)
    assert bucket.level == 870 and unanswered.settle() == 100 and bucket.level == 970
    assert gate.admit(None, body) is NO_CHARGE and gate.admit(Tenant("u", frozenset()), body) is NO_CHARGE
