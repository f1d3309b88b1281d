"""Two fresh servers, as two fresh replicas of one model: an unseeded sampled request draws differently on
each (each engine process seeds its sampling at random), while a request with a `seed` gives the same text
on both. Before, every replica seeded with 0 and emitted the same "random" text. Over HTTP, with the
`openai` client, in both engine modes."""

from __future__ import annotations

import openai
import pytest

from tests.server.http.server_process import run_server

PROMPT = "once upon a time"


def sample(base_url: str, **extra: int) -> str:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=1.0,
                                     extra_body={"ignore_eos": True}, **extra).choices[0].text


@pytest.mark.parametrize("mode", ["process", "inprocess"])
def test_fresh_servers_differ_unseeded_and_agree_seeded(mode, tmp_path) -> None:
    texts = []
    for _ in range(2):
        with run_server("--engine-mode", mode, "--max-model-len", "256", tmp_path=tmp_path) as server:
            texts.append((sample(server.base_url), sample(server.base_url, seed=7)))
    (unseeded_a, seeded_a), (unseeded_b, seeded_b) = texts
    assert seeded_a == seeded_b
    assert unseeded_a != unseeded_b
