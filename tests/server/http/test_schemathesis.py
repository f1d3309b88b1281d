"""Property-based fuzzing of every operation in the server's own OpenAPI schema: no input may cause a 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

EXAMPLES_PER_OPERATION = 30


def _shorten(case) -> None:
    """Keep generations short and unstreamed: this test is about inputs, not throughput."""
    if isinstance(case.body, dict):
        if case.body.get("stream") is True and "stream_options" not in case.body:
            case.body["stream"] = False
        if isinstance(case.body.get("max_tokens"), int) and case.body["max_tokens"] > 8:
            case.body["max_tokens"] = 8


def test_no_server_errors_on_any_operation(server):
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    statuses: dict[str, set[int]] = {}
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None, derandomize=True)
        def run(case):
            _shorten(case)
            response = case.call(timeout=60)
            statuses.setdefault(case.operation.path, set()).add(response.status_code)
            case.validate_response(response, checks=[not_a_server_error])

        run()
    assert all(code < 500 for codes in statuses.values() for code in codes), statuses
    assert 400 in statuses["/v1/completions"]  # the fuzzer did reach the validation paths
