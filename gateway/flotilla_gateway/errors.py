"""OpenAI-style JSON errors, shaped and worded as flotilla-server words them, so a client cannot tell
which of the two refused it (the gateway must not import the server: docs/gateway.md, "Layers")."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


class GatewayError(Exception):
    """Raised anywhere in a request's path; rendered as {"error": {...}} with its status and headers."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def response(self) -> Response:
        return error_response(self.status, self.message, self.param, self.code, self.headers)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    payload = json.dumps(error_body(status, message, param, code)).encode()
    return Response(payload, status_code=status, headers=headers, media_type="application/json")
