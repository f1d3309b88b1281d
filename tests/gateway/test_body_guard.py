"""The gateway refuses a missing or non-string `model` in the server's own words. It cannot import the server
to ask pydantic, so it words the refusal itself, and these tests hold the two to the same text. (The 413 and
400 body refusals need no such test: both programs take them from flotilla_contract.request_body.)"""

from __future__ import annotations

import json

import pytest
from flotilla_gateway.body_guard import model_problem
from flotilla_server.http.errors import describe_validation_error
from flotilla_server.http.schemas import CompletionRequest
from pydantic import ValidationError


@pytest.mark.parametrize("body", [{"prompt": "hi"}, {"model": 5, "prompt": "hi"}, {"model": None, "prompt": "hi"}])
def test_model_problems_match_the_server(body: dict) -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate_json(json.dumps(body))
    errors = [e for e in caught.value.errors() if e["loc"][0] == "model"]
    server_message, _ = describe_validation_error([{**e, "loc": ("body", *e["loc"])} for e in errors])
    assert model_problem(body) == server_message


def test_a_string_model_is_fine() -> None:
    assert model_problem({"model": "tiny"}) is None
