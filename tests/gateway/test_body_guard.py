"""The gateway refuses bad bodies in the server's own words (it re-implements them, since it must not import
the server): these tests hold the two to the same text."""

from __future__ import annotations

import json

import pytest
from flotilla_gateway.body_guard import body_problem, model_problem, too_large_message
from flotilla_server.http.body_guard import BodyGuard
from flotilla_server.http.errors import describe_validation_error
from flotilla_server.http.schemas import CompletionRequest
from pydantic import ValidationError


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"{not json", b"[1, 2]", b'"text"', b"{}"])
def test_body_problems_match_the_server(raw: bytes) -> None:
    assert body_problem(raw) == BodyGuard._problem(raw)


def test_too_large_matches_the_server() -> None:
    assert too_large_message(1234) == BodyGuard(app=None, max_body_bytes=1234)._too_large()  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [{"prompt": "hi"}, {"model": 5, "prompt": "hi"}, {"model": None, "prompt": "hi"}])
def test_model_problems_match_the_server(body: dict) -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate_json(json.dumps(body))
    errors = [e for e in caught.value.errors() if e["loc"][0] == "model"]
    server_message, _ = describe_validation_error([{**e, "loc": ("body", *e["loc"])} for e in errors])
    assert model_problem(body) == server_message


def test_a_string_model_is_fine() -> None:
    assert model_problem({"model": "tiny"}) is None
