"""OpenAI-style JSON errors: every error a client can cause gets a 4xx and a message that says what to change."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    503: "service_unavailable",
}


class APIError(Exception):
    """Raised by handlers; rendered as {"error": {...}} with its status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        counted: bool = False,
    ) -> None:
        super().__init__(message)
        self.counted = counted  # the status code is already in flotilla_requests_total
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code), status_code=err.status,
                        headers=err.headers)


def describe_validation_error(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable message from pydantic's error list, and the first offending field."""
    parts = []
    first_param: str | None = None
    for e in errors[:5]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        # union members add their type name to the path; it only confuses the reader
        loc = [x for x in loc if not (x.startswith(("str", "list[", "int", "function-")) or x in {"constrained-str"})]
        # a tagged union adds its tag too (response_format.json_schema.json_schema.schema): said once
        loc = [x for i, x in enumerate(loc) if i == 0 or x != loc[i - 1]]
        field = ".".join(loc) or "body"
        first_param = first_param or field
        msg = e.get("msg", "invalid value")
        if "input" in e and e.get("type") not in ("missing", "json_invalid"):
            got = repr(e["input"])
            msg = f"{msg} (got {got[:60]})"
        parts.append(f"{field}: {msg}")
    if len(errors) > 5:
        parts.append(f"and {len(errors) - 5} more")
    return "Invalid request: " + "; ".join(parts) + ". Fix these fields and retry.", first_param


def _count(request: Request, status: int) -> None:
    state = getattr(request.app.state, "flotilla", None)
    if state is not None:
        state.metrics.count_request(status)


def install_error_handlers(app: FastAPI) -> None:
    """Render every client-caused error OpenAI-style, and count its status in flotilla_requests_total."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if not exc.counted:
            _count(request, exc.status)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(list(exc.errors()))
        content_type = request.headers.get("content-type", "")
        if "json" not in content_type.lower():  # e.g. curl -d without -H: FastAPI never parsed the body
            message = (f"The body must be JSON sent with 'Content-Type: application/json' "
                       f"(got Content-Type {content_type or 'none'!r}).")
            param = "body"
        _count(request, 400)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        _count(request, exc.status_code)
        if exc.status_code == 404:
            message = f"No route {request.url.path}: see /docs for the endpoints (e.g. POST /v1/chat/completions)."
        elif exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow")
            message = f"Method {request.method} is not allowed on {request.url.path}" + (
                f": use {allow}." if allow else "."
            )
        else:
            message = str(exc.detail)
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=exc.headers)
