"""`flotilla-server --api-key` on a real server: the OpenAI endpoints need the key (401 in OpenAI's shape
otherwise), the probes, /metrics and the load report stay open, and the openai SDK streams with the key."""

from __future__ import annotations

import httpx
import openai
import pytest
from flotilla_contract.load import LOAD_PATH

from tests.server.http.server_process import run_server

KEY = "sk-server-test-123"


def test_api_key_guards_the_openai_endpoints_only(tmp_path):
    # the key comes from the environment (what the operator sets from a Secret), not the command line
    with run_server("--max-model-len", "256", env={"FLOTILLA_API_KEY": KEY}, tmp_path=tmp_path) as server, \
            httpx.Client(base_url=server.base_url, timeout=30) as client:
        body = {"model": "tiny", "prompt": "the sea", "max_tokens": 2}
        for headers, says in (({}, "Missing API key"), ({"Authorization": "Bearer sk-wrong"}, "Incorrect API key"),
                              ({"Authorization": KEY}, "Incorrect API key")):
            r = client.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401, headers
            error = r.json()["error"]
            assert error["code"] == "invalid_api_key" and says in error["message"]
            assert error["type"] == "authentication_error"
        assert client.get("/v1/models").status_code == 401
        for open_path in ("/healthz", "/readyz", "/metrics", LOAD_PATH):
            assert client.get(open_path).status_code == 200, open_path
        assert server.metric("flotilla_requests_total", code="200") == 0  # nothing reached the engine

        sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)
        chunks = list(sdk.completions.create(model="tiny", prompt="the sea", max_tokens=4, stream=True,
                                             extra_body={"ignore_eos": True}))  # tiny's greedy text may meet EOS
        assert chunks and chunks[-1].choices[0].finish_reason == "length"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-other", max_retries=0).models.list()


def test_an_empty_key_is_refused_at_start():
    from flotilla_server.cli import parse_settings

    with pytest.raises(SystemExit):
        parse_settings([], {"FLOTILLA_API_KEY": " "})
