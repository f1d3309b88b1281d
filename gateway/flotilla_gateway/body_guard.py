"""Read and check a request body before routing: the same limits and the same messages as flotilla-server.

A body over `max_body_bytes` gets 413; a POST body that is not a UTF-8 JSON object gets 400; a body
without a string `model` gets 400 worded as the server's validation error. The messages are the
server's, word for word, so a client sees one API whichever of the two refused it.
"""

from __future__ import annotations

import json
from typing import Any

from flotilla_contract.request_body import body_problem, too_large_message
from starlette.requests import ClientDisconnect, Request

from flotilla_gateway.errors import GatewayError

_DISCARD_FACTOR = 16  # beyond this many limits of excess, stop reading and just answer


def model_problem(body: dict[str, Any]) -> str | None:
    """The server's pydantic message for a missing or non-string `model`; None when it is a string."""
    if "model" not in body:
        return "Invalid request: model: Field required. Fix these fields and retry."
    if not isinstance(body["model"], str):
        got = repr(body["model"])
        return f"Invalid request: model: Input should be a valid string (got {got[:60]}). Fix these fields and retry."
    return None


async def read_body(request: Request, max_body_bytes: int) -> tuple[bytes, dict[str, Any]]:
    """The raw body and its parsed object, or GatewayError (413 or 400) in the server's words."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        await _discard(request, max_body_bytes)
        raise GatewayError(413, too_large_message(max_body_bytes))
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise GatewayError(413, too_large_message(max_body_bytes))
            chunks.append(chunk)
    except ClientDisconnect:
        raise GatewayError(499, "The client closed the connection before sending the whole body.") from None
    raw = b"".join(chunks)
    problem = body_problem(raw)
    if problem is not None:
        raise GatewayError(400, problem)
    body = json.loads(raw)
    problem = model_problem(body)
    if problem is not None:
        raise GatewayError(400, problem, param="model")
    return raw, body


async def _discard(request: Request, max_body_bytes: int) -> None:
    """Drop the rest of an oversized body (up to a bound), so the client reads a clean 413, not a reset."""
    dropped = 0
    try:
        async for chunk in request.stream():
            dropped += len(chunk)
            if dropped > _DISCARD_FACTOR * max_body_bytes:
                return
    except ClientDisconnect:
        return
