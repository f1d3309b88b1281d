"""--speculative over HTTP: flags refused with one line, the per-request opt-out, the counters on /metrics, a
streamed reply that is the same as the whole one."""

from __future__ import annotations

import json

import httpx
import pytest
from flotilla_server.cli import parse_settings

from tests.server.http.server_process import run_server

PROMPT = "one two three four one two three four one two three four one two three four one two"


@pytest.mark.parametrize(("argv", "message"), [
    (["--speculative", "ngram", "--speculative-tokens", "0"], "error: --speculative-tokens must be in 1..16, got 0"),
    (["--speculative", "ngram", "--speculative-tokens", "17"], "error: --speculative-tokens must be in 1..16, got 17"),
    (["--speculative", "eagle"], "error: --speculative must be one of off, ngram, got 'eagle'"),
])
def test_bad_flags_exit_2_with_one_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with run_server("--speculative", "ngram", "--speculative-tokens", "6", "--max-model-len", "512",
                    "--engine-mode", "inprocess", tmp_path=tmp_path_factory.mktemp("spec-server")) as s:
        yield s


def complete(server, **extra) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True, **extra}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_opt_out_metrics_and_streaming(server) -> None:
    plain = complete(server, speculative=False)
    assert server.metric("flotilla_spec_decode_drafts_total") == 0, "an opted-out request drafted"
    spec = complete(server)
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"]
    assert spec["usage"]["completion_tokens"] == 40
    proposed = server.metric("flotilla_spec_decode_proposed_tokens_total")
    accepted = server.metric("flotilla_spec_decode_accepted_tokens_total")
    assert server.metric("flotilla_spec_decode_drafts_total") > 0 and proposed >= accepted > 0
    assert server.metric("flotilla_spec_decode_acceptance_rate") == pytest.approx(accepted / proposed)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stream": True}
    text = ""
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    assert text == plain["choices"][0]["text"]
    bad = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                     json={"model": "tiny", "prompt": "Hi", "max_tokens": 1, "speculative": "maybe"})
    assert bad.status_code == 400 and "speculative" in bad.text
