"""SmolLM2-135M-Instruct from its GGUF, served by a real flotilla-server from the file's blocks (the default,
`--quantization gguf`), against transformers, which dequantizes the same file.

One server process and one transformers reference serve every test here (the server starts while the
reference loads). The server runs with a prefill chunk of 16 tokens, shorter than every prompt
(the GGUF's template alone adds a 30-token system prompt), so every answer below went through
chunked prefill; the batch test also runs 8 sequences at once. Each answer is checked against
transformers by teacher forcing (gguf_reference.is_reference_greedy), one prefill per answer.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from flotilla_server.model.gguf_tokenizer import tokenizer_from_gguf
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import run_server

from .gguf_reference import is_reference_greedy, load_reference, smollm2_gguf

NAME = "smollm2-135m-instruct"
MAX_TOKENS = 12
IM_END = 2  # <|im_end|>, the GGUF's eos_token_id
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Translate 'good morning' into Spanish.",
    "Say hello.",
    "Why is the sky blue?",
    "List two fruits that are red.",
]
PREFILL_CHUNK = 16


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(server, reference, tokenizer, gguf path), the server started first so that both load at once."""
    path = smollm2_gguf()
    server_cm = run_server("--prefill-chunk", str(PREFILL_CHUNK), "--max-num-seqs", "8",
                           "--max-model-len", "512", "--kv-cache-memory", "64Mi",
                           tmp_path=tmp_path_factory.mktemp("smollm2"), startup_timeout_s=300,
                           model_args=("--model", str(path)),
                           # exact greedy equality needs the exact products: AVX2's default int16 activations
                           # are held to their bound and teacher-forced bars (test_quant_kernels.py,
                           # test_quantized_accuracy.py), not to transformers' ties
                           env={"FLOTILLA_KERNEL_ACTIVATIONS": "float"})
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(server_cm.__enter__)
        try:
            reference = load_reference(path, num_layers=30)
            server = starting.result()
        except BaseException:
            starting.cancel()
            if starting.done() and starting.exception() is None:
                server_cm.__exit__(None, None, None)
            raise
    try:
        from flotilla_server.model.gguf_file import GGUFModel

        yield server, reference, tokenizer_from_gguf(GGUFModel(path)), path
    finally:
        server_cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def alone(smollm2):
    """The answers to QUESTIONS, one request at a time."""
    return [_chat(smollm2[0], q) for q in QUESTIONS]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(server, question: str):
    return _client(server).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS, temperature=0)


def _answer_ids(answer, tokenizer) -> list[int]:
    """The answer's token ids: its text re-encoded, plus <|im_end|> when it stopped. The count must
    equal the server's own, and the text must survive the round trip."""
    text = answer.choices[0].message.content
    ids = tokenizer.encode(text, add_special_tokens=False)
    if answer.choices[0].finish_reason == "stop":
        ids.append(IM_END)
    else:
        assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == len(ids) and tokenizer.decode(ids) == text
    return ids


def _prompt_ids(tokenizer, question: str) -> list[int]:
    """The prompt as the GGUF's template renders it."""
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}]),
                            add_special_tokens=False)


def _check(smollm2, answers) -> None:
    _, reference, tokenizer, _ = smollm2
    for question, answer in zip(QUESTIONS, answers, strict=True):
        prompt = _prompt_ids(tokenizer, question)
        assert answer.usage.prompt_tokens == len(prompt)  # the server rendered the same template
        assert is_reference_greedy(reference.model, prompt, _answer_ids(answer, tokenizer)), (question, answer)


def test_capital_of_france_is_paris(smollm2):
    server = smollm2[0]
    answer = _chat(server, "What is the capital of France?")
    assert "Paris" in answer.choices[0].message.content
    assert answer.model == NAME
    assert [m.id for m in _client(server).models.list().data] == [NAME]


def test_the_file_is_served_from_its_blocks_and_says_so(smollm2):
    """`make run`'s default: the Q4_1 projections and the Q8_0 embedding (the tied head) stay in their blocks,
    at most 1.3x the file's bytes of weights, shown in /v1/models and as a gauge (docs/models.md)."""
    server, path = smollm2[0], smollm2[3]
    card = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"][0]
    assert card["quantization"] == "gguf:Q4_1+Q8_0"
    assert 0 < card["weight_bytes"] <= 1.3 * path.stat().st_size
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    (held,) = [s for f in text_string_to_metric_families(metrics) for s in f.samples
               if s.name == "flotilla_model_weight_bytes"]
    assert held.labels == {"model": NAME, "quantization": "gguf:Q4_1+Q8_0"} and held.value == card["weight_bytes"]


def test_greedy_chat_equals_transformers_one_at_a_time(smollm2, alone):
    _check(smollm2, alone)


def test_greedy_chat_equals_transformers_in_a_batch_of_8(smollm2, alone):
    server = smollm2[0]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        batched = list(pool.map(lambda q: _chat(server, q), QUESTIONS))
    # the same text, ending and token counts as alone, which test_..._one_at_a_time checks against transformers
    tokenizer = smollm2[2]
    assert [_answer_ids(a, tokenizer) for a in batched] == [_answer_ids(a, tokenizer) for a in alone]
    assert [a.usage.prompt_tokens for a in batched] == [a.usage.prompt_tokens for a in alone]


def test_im_end_stops_with_finish_reason_stop(alone):
    """Both endings occur among the answers checked above: <|im_end|> (finish_reason "stop", the
    token not in the text) and the max_tokens limit ("length")."""
    reasons = [a.choices[0].finish_reason for a in alone]
    assert "stop" in reasons and "length" in reasons
    assert not any("<|im_end|>" in a.choices[0].message.content for a in alone)


def test_template_and_config_come_from_the_gguf(smollm2):
    _, reference, tokenizer, _ = smollm2
    assert tokenizer.chat_template == reference.parsed["tokenizer_config"]["chat_template"]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert all(len(_prompt_ids(tokenizer, q)) > PREFILL_CHUNK for q in QUESTIONS)


def test_tokenizer_matches_transformers_gguf_conversion(smollm2):
    """transformers builds its tokenizer from the same metadata; it does not know the "smollm"
    pre-tokenizer, which (in llama.cpp and in SmolLM2's own tokenizer.json) puts every digit alone,
    so texts with digits are compared with that rule instead."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    _, reference, tokenizer, _ = smollm2
    theirs, _ = convert_gguf_tokenizer("llama", reference.parsed["tokenizer"])
    for text in ["Hello, world! How are you?", "  leading spaces\n\ttabs", "héllo wörld — ünïcode ✓",
                 "<|im_start|>user\nHi<|im_end|>\n"]:
        assert tokenizer.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text
    digits = tokenizer.encode("2024", add_special_tokens=False)
    assert [tokenizer.decode([t]) for t in digits] == ["2", "0", "2", "4"]
