"""The gateway's rate limits on the request path: admit a request at its key (or answer 429), watch its answer
pass, and settle its reservation when the answer ends. The decisions are rate_limit.py's; this is the shell.

app.py calls `admit` once the key is known and `settle` when a request ends without an answer; an answer
settles itself when its last byte has passed (`Charge.metered`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flotilla_gateway.errors import GatewayError
from flotilla_gateway.keys import Tenant
from flotilla_gateway.rate_limit import (
    NO_LIMIT,
    Decision,
    RateLimit,
    RateLimiter,
    duration,
    ratelimit_headers,
    retry_after,
)
from flotilla_gateway.rate_limit_cost import RequestCost, request_cost
from flotilla_gateway.rate_limit_usage import UsageMeter

_HEADER_PREFIX = b"x-ratelimit-"


class RefusalCounter(Protocol):
    def labels(self, tenant: str, reason: str) -> Any: ...


class Charge:
    """One admitted request's reservation: adds its x-ratelimit-* headers to the answer, meters the answer,
    and settles once, however the request ends."""

    def __init__(self, limiter: RateLimiter | None = None, decision: Decision | None = None,
                 cost: RequestCost | None = None) -> None:
        self.limiter = limiter
        self.decision = decision
        self.meter = UsageMeter(cost.prompt_tokens if cost is not None else 0)
        self.settled = decision is None or decision.reservation is None  # nothing to give back or charge
        self.headers = ratelimit_headers(decision.standings) if decision is not None else {}

    def metered(self, response: ASGIApp) -> ASGIApp:
        return response if self.decision is None else _Metered(response, self)

    def settle(self) -> int:
        """Reconcile the reservation with what the answer used (no answer: nothing used); the tokens given back."""
        if self.settled:
            return 0
        self.settled = True
        assert self.limiter is not None and self.decision is not None and self.decision.reservation is not None
        return self.limiter.reconcile(self.decision.reservation, self.meter.used_tokens())


NO_CHARGE = Charge()  # a request of a key without limits, or with keys off


class _Metered:
    """The answer as it was, plus the key's x-ratelimit-* headers; each chunk is shown to the meter on its way
    to the client, and the charge settles when the answer ends (also when the client leaves)."""

    def __init__(self, response: ASGIApp, charge: Charge) -> None:
        self.response = response
        self.charge = charge
        self.status_code = getattr(response, "status_code", 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        charge = self.charge

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if not k.lower().startswith(_HEADER_PREFIX)]
                content_type = next((v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"), "")
                charge.meter.start(message["status"], content_type)
                headers += [(k.encode(), v.encode()) for k, v in charge.headers.items()]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                charge.meter.feed(message.get("body", b""))
            await send(message)

        try:
            await self.response(scope, receive, watched)
        finally:
            charge.settle()


class RateLimits:
    """Every key's rate limits on this gateway replica (limit/replicas each: docs/gateway.md, "Rate limits")."""

    def __init__(self, refused: RefusalCounter, replicas: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limiter = RateLimiter(replicas, clock)
        self.refused = refused  # flotilla_gateway_rate_limited_requests_total{tenant, reason}

    def admit(self, tenant: Tenant | None, body: dict[str, Any]) -> Charge:
        """The request's charge, or GatewayError 429 (with Retry-After unless it can never fit)."""
        if tenant is None or tenant.limits == NO_LIMIT:
            return NO_CHARGE
        cost = request_cost(body, self.limiter.capacity(tenant.limits, "tokens"))
        decision = self.limiter.decide(tenant.key or tenant.name, tenant.limits, cost.num_tokens)
        if decision.admitted:
            return Charge(self.limiter, decision, cost)
        assert decision.reason is not None
        self.refused.labels(tenant.name, decision.reason).inc()
        headers = ratelimit_headers(decision.standings)
        if decision.reason == "too_large":
            param = "max_tokens" if cost.output_stated else ("messages" if "messages" in body else "prompt")
            raise GatewayError(429, _too_large(tenant, cost, self._limit_text(tenant.limits, "tokens")),
                               param=param, code="request_too_large", headers=headers)
        assert decision.retry_after_s is not None
        headers["Retry-After"] = retry_after(decision.retry_after_s)
        kind = decision.reason
        asked = "" if kind == "requests" else f" This request reserves {cost.num_tokens} tokens{_breakdown(cost)}."
        raise GatewayError(429, f"Rate limit reached for the key of tenant {tenant.name!r} on {kind} per minute: "
                                f"{self._limit_text(tenant.limits, kind)}.{asked} Retry in "
                                f"{duration(decision.retry_after_s)}.", code="rate_limit_exceeded", headers=headers)

    def _limit_text(self, limits: RateLimit, kind: str) -> str:
        per_min = limits.requests_per_min if kind == "requests" else limits.tokens_per_min
        replicas = self.limiter.replicas
        if replicas == 1:
            return f"limit {per_min} per minute"
        return f"limit {per_min} per minute, {per_min / replicas:g} on each of {replicas} gateway replicas"


def _breakdown(cost: RequestCost) -> str:
    output = "max_tokens" if cost.output_stated else "the gateway's reservation for an unstated max_tokens"
    return f" (the prompt, about {cost.prompt_tokens} tokens, plus {output}: {cost.output_tokens})"


def _too_large(tenant: Tenant, cost: RequestCost, limit: str) -> str:
    return (f"This request can never fit the rate limit of the key of tenant {tenant.name!r}: it reserves "
            f"{cost.num_tokens} tokens{_breakdown(cost)}, more than the whole tokens per minute ({limit}). "
            "Lower max_tokens or shorten the prompt, or ask for a higher tokensPerMinute; retrying will not help.")
