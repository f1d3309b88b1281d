"""n, lists of prompts, echo and logprobs through the real openai SDK, streamed and not, on tiny.

The SDK parses every new field into its own types (`ChoiceLogprobs`, the legacy `Logprobs`), with no field
left over: the shapes are OpenAI's, not look-alikes.
"""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from openai.types import completion_choice
from openai.types.chat import chat_completion

PROMPT = "the ships sail north to the harbour"
MESSAGES = [{"role": "user", "content": PROMPT}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _streamed_texts(chunks, chat: bool) -> dict[int, str]:
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ((ch.delta.content or "") if chat else ch.text)
    return texts


def test_n_choices_streamed_and_whole_with_usage_summed(server) -> None:
    client = _client(server)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "n": 3}
    whole = client.completions.create(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.text for c in whole.choices}) == 1  # greedy: the choices are the same
    one = client.completions.create(**{**kw, "n": 1})
    assert whole.usage.completion_tokens == 3 * 12
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert _streamed_texts(chunks, chat=False) == {c.index: c.text for c in whole.choices}
    finishes = [(ch.index, ch.finish_reason) for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length"), (2, "length")]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_n_choices_each_open_with_a_role_and_sample_apart_under_a_seed(server) -> None:
    client = _client(server)
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 10, "temperature": 1.0, "seed": 5, "n": 2}
    whole = client.chat.completions.create(**kw)
    texts = [c.message.content for c in whole.choices]
    assert texts[0] != texts[1], "two sampled choices of one request came out the same"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    roles = [ch.index for c in chunks for ch in c.choices if ch.delta.role == "assistant"]
    assert roles == [0, 1]
    assert _streamed_texts(chunks, chat=True) == {0: texts[0], 1: texts[1]}  # seeded: the same again


def test_a_list_of_prompts_answers_n_choices_each_numbered_prompt_times_n_plus_j(server) -> None:
    client = _client(server)
    prompts = [PROMPT, "a lighthouse at dusk"]
    kw = {"model": "tiny", "max_tokens": 6, "temperature": 0}
    alone = [client.completions.create(**kw, prompt=p).choices[0].text for p in prompts]
    both = client.completions.create(**kw, prompt=prompts, n=2)
    assert [(c.index, c.text) for c in both.choices] == [(0, alone[0]), (1, alone[0]), (2, alone[1]), (3, alone[1])]
    tokenized = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                           json={**kw, "prompt": [[5, 6, 7, 8], [9, 10, 11]]}).json()
    single = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={**kw, "prompt": [9, 10, 11]}).json()
    assert [c["index"] for c in tokenized["choices"]] == [0, 1]
    assert tokenized["choices"][1]["text"] == single["choices"][0]["text"]
    assert tokenized["usage"]["prompt_tokens"] == 7


def test_echo_starts_each_choice_with_its_prompt(server) -> None:
    client = _client(server)
    kw = {"model": "tiny", "prompt": [PROMPT, "a lighthouse"], "max_tokens": 5, "temperature": 0}
    plain = client.completions.create(**kw)
    echoed = client.completions.create(**kw, echo=True)
    assert [c.text for c in echoed.choices] == [PROMPT + plain.choices[0].text, "a lighthouse" + plain.choices[1].text]
    chunks = list(client.completions.create(**kw, echo=True, stream=True))
    assert _streamed_texts(chunks, chat=False) == {c.index: c.text for c in echoed.choices}


def test_chat_logprobs_in_openai_shape_streamed_and_whole(server) -> None:
    client = _client(server)
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8, "temperature": 0, "logprobs": True,
          "top_logprobs": 4}
    whole = client.chat.completions.create(**kw)
    lp = whole.choices[0].logprobs
    assert isinstance(lp, chat_completion.ChoiceLogprobs) and len(lp.content) == whole.usage.completion_tokens
    for entry in lp.content:
        assert entry.model_extra == {} and entry.bytes == list(entry.token.encode())
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 4 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob  # greedy
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in lp.content]
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_completions_logprobs_in_the_legacy_shape_streamed_and_whole(server) -> None:
    client = _client(server)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 2}
    whole = client.completions.create(**kw)
    lp = whole.choices[0].logprobs
    assert isinstance(lp, completion_choice.Logprobs) and lp.model_extra == {}
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for i, (token, logprob, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)):
        assert 1 <= len(top) <= 3 and top[token] == logprob == max(top.values())  # greedy: the likeliest
        if i:
            assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
    chunks = list(client.completions.create(**kw, stream=True))
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for ch in c.choices:
            for key in merged:
                merged[key] += getattr(ch.logprobs, key) if ch.logprobs else []
    assert merged == lp.model_dump()
    zero = client.completions.create(**{**kw, "logprobs": 0}).choices[0].logprobs
    assert zero.token_logprobs == lp.token_logprobs and all(len(t) == 1 for t in zero.top_logprobs)


def test_logprob_bounds_and_combinations_get_a_400_saying_what_to_change(server) -> None:
    def post(path: str, body: dict) -> dict:
        r = httpx.post(f"{server.base_url}{path}", json={"model": "tiny", "max_tokens": 2, **body}, timeout=60)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    chat, cmpl = "/v1/chat/completions", "/v1/completions"
    e = post(chat, {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21})
    assert e["param"] == "top_logprobs" and "set top_logprobs to 20 or less" in e["message"]
    e = post(chat, {"messages": MESSAGES, "top_logprobs": 3})
    assert e["param"] == "top_logprobs" and "set logprobs to true" in e["message"]
    e = post(cmpl, {"prompt": PROMPT, "logprobs": 21})
    assert e["param"] == "logprobs" and "set logprobs to 20 or less" in e["message"]
    e = post(cmpl, {"prompt": PROMPT, "logprobs": 1, "echo": True})
    assert e["param"] == "echo" and "drop echo or logprobs" in e["message"]
    e = post(cmpl, {"prompt": PROMPT, "n": 65})  # the server runs 64 sequences
    assert e["param"] == "n" and "set n to 64 or less" in e["message"]


def _stream_until_every_choice_has_a_token(server, n: int, prompt: str) -> tuple[float, float]:
    """(KV blocks in use, requests running) read from /metrics while an n-choice request is mid-stream."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 150, "ignore_eos": True, "temperature": 0, "n": n,
            "stream": True}
    spoke: set[int] = set()
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                spoke |= {c["index"] for c in json.loads(line[6:])["choices"]}  # one chunk per token, text or not
            if len(spoke) == n:
                return server.metric("flotilla_kv_blocks_used"), server.metric("flotilla_requests_running")
    raise AssertionError("the stream ended before every choice produced a token")


@pytest.mark.serial  # a reading mid-stream: on a busy machine the forks' outputs outgrow the bound before it
def test_n_4_holds_under_1_5x_the_blocks_of_n_1_and_counts_as_4_running(server) -> None:
    prompt = f"{uuid.uuid4()} " + "a long prompt that fills many blocks of the cache. " * 6
    blocks_1, running_1 = _stream_until_every_choice_has_a_token(server, 1, prompt)
    blocks_4, running_4 = _stream_until_every_choice_has_a_token(server, 4, prompt.replace("long", "lengthy"))
    assert blocks_1 >= 10, "the prompt is too short to tell sharing apart"
    assert blocks_4 < 1.5 * blocks_1, f"n=4 held {blocks_4} blocks, n=1 {blocks_1}: the prompt was not shared"
    assert (running_1, running_4) == (1, 4)
