"""Gemma 3 270M from its Q4_K_M GGUF (the second real model: scripts/fetch_gemma3.py, docs/models.md), served by a
real flotilla-server from the file's blocks, against transformers, which dequantizes the same file.

The file is the pretrained model, not the instruction-tuned one, so it is asked by completion. Its 18 layers
are 15 sliding-window layers of 512 keys and 3 global ones; its Q5_0, Q8_0, Q4_K and Q6_K tensors are rows
of 640 (not a multiple of 256, so llama.cpp stored those in Q5_0/Q8_0). One server and one transformers
reference serve every test (the server starts while the reference loads); the server prefills in chunks of
16 tokens, and each answer is checked against transformers by teacher forcing (is_reference_greedy).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from flotilla_server.model import load_model
from flotilla_server.model.gguf_file import GGUFModel
from flotilla_server.model.gguf_tokenizer import tokenizer_from_gguf
from flotilla_server.model.source import gguf_tensors, source_config
from flotilla_server.model_cache.footprint import dense_weight_bytes, gguf_weight_bytes

from tests.server.http.server_process import run_server

from .gguf_reference import (
    REPO,
    is_reference_greedy,
    load_reference,
    tokenizer_parameters,
    without_vocabulary,
)
from .paged import paged_greedy

NAME = "gemma-3-270m"
MAX_TOKENS = 8
PREFILL_CHUNK = 4
PROMPTS = [
    "The capital of France is the city of",
    "Paris is the capital of",
    "Q: What is the capital of France?\nA:",
    "The Eiffel Tower is in the city of",
    "Water freezes at a temperature of",
    "The largest planet in the solar system is",
    "2 + 2 =",
    "The chemical symbol for gold is",
]


def gemma3_gguf() -> Path:
    """The cached Gemma 3 270M GGUF: downloaded at most once (by `make model`), offline after that."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_gemma3.py")],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """(server, reference, tokenizer, gguf path, the answers to PROMPTS one at a time): the server starts and
    answers while the reference loads, from the file less its vocabulary (without_vocabulary: the same tensors
    and config, and 8 s instead of 24)."""
    path = gemma3_gguf()
    slim = without_vocabulary(path, tmp_path_factory.mktemp("gemma3-reference") / path.name)
    server_cm = run_server("--prefill-chunk", str(PREFILL_CHUNK), "--max-num-seqs", "8",
                           "--max-model-len", "512", "--kv-cache-memory", "64Mi",
                           tmp_path=tmp_path_factory.mktemp("gemma3"), startup_timeout_s=300,
                           model_args=("--model", str(path)),
                           # exact greedy equality needs the exact products (test_gguf_smollm2.py says why)
                           env={"FLOTILLA_KERNEL_ACTIVATIONS": "float"})
    def start_and_ask():
        started = server_cm.__enter__()
        return started, [_complete(started, p) for p in PROMPTS]

    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start_and_ask)
        try:
            reference = load_reference(slim, num_layers=18, arch="gemma3_text")
            server, alone = starting.result()
        except BaseException:
            starting.cancel()
            if starting.done() and starting.exception() is None:
                server_cm.__exit__(None, None, None)
            raise
    try:
        yield server, reference, tokenizer_from_gguf(GGUFModel(path)), path, alone
    finally:
        server_cm.__exit__(None, None, None)


def _complete(server, prompt: str):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    return client.completions.create(model=NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)


@pytest.fixture(scope="module")
def alone(gemma3):
    return gemma3[4]


def _ids(answer, tokenizer) -> list[int]:
    """The answer's token ids: its text re-encoded; the count must equal the server's own."""
    text = answer.choices[0].text
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert answer.usage.completion_tokens == len(ids) and tokenizer.decode(ids) == text, (text, ids)
    return ids


def test_answers_a_factual_question(gemma3, alone):
    assert alone[0].choices[0].text.startswith(" Paris") and alone[0].model == NAME
    card = httpx.get(f"{gemma3[0].base_url}/v1/models", timeout=10).json()["data"][0]
    assert card["id"] == NAME and card["quantization"] == "gguf:Q4_K+Q5_0+Q6_K+Q8_0"
    assert 0 < card["weight_bytes"] <= 1.3 * gemma3[3].stat().st_size
    # what a pool charges before loading it (model_cache/footprint.py) is what the server holds
    assert gguf_weight_bytes(source_config(str(gemma3[3])), gguf_tensors(str(gemma3[3])), "float32", "cpu") == \
        card["weight_bytes"]


def test_greedy_equals_transformers_one_at_a_time(gemma3, alone):
    _, reference, tokenizer, *_ = gemma3
    for prompt, answer in zip(PROMPTS, alone, strict=True):
        prompt_ids = tokenizer.encode(prompt)
        assert answer.usage.prompt_tokens == len(prompt_ids) > PREFILL_CHUNK
        assert is_reference_greedy(reference.model, prompt_ids, _ids(answer, tokenizer)), (prompt, answer)


def test_greedy_equals_transformers_in_a_batch_of_8(gemma3, alone):
    server, _, tokenizer, *_ = gemma3
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(lambda p: _complete(server, p), PROMPTS))
    # the same tokens as alone, which test_..._one_at_a_time checks against transformers
    assert [_ids(a, tokenizer) for a in batched] == [_ids(a, tokenizer) for a in alone]


def test_dequantized_equals_transformers_exactly(gemma3):
    """`--quantization none`: the same file dequantized to float32, in one batch of chunked prefills and decodes,
    and each prompt alone."""
    _, reference, tokenizer, path, _ = gemma3
    loaded = load_model(str(path), "float32", "cpu", "none")
    assert loaded.model.quantization() == "none"
    assert dense_weight_bytes(loaded.config, "float32", "cpu") == loaded.model.weight_bytes()  # the pool's charge
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    # 4 new tokens, prompts whole or in chunks of 8, joining over 2 steps: every float32 step reads 1 GB of weights
    got = paged_greedy(loaded.model, prompts, 4, chunk=8, start_steps=[0, 1] * 4)
    for prompt, answer in zip(prompts, got, strict=True):
        assert is_reference_greedy(reference.model, prompt, answer), (prompt, answer)
    # and each alone (batch-1 decode steps take other paths): the same tokens as in the batch
    assert [paged_greedy(loaded.model, [prompt], 4, chunk=8)[0] for prompt in prompts] == got


def test_tokenizer_matches_transformers_gguf_conversion(gemma3):
    """SentencePiece with no space prefix (tokenizer.ggml.add_space_prefix false), byte fallback and a 262,144-token
    vocabulary, against transformers' conversion of the same metadata."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokenizer = gemma3[2]
    theirs, _ = convert_gguf_tokenizer("gemma3", tokenizer_parameters(gemma3[3]))
    texts = [*PROMPTS, "Hello  world\n\tcode()  ", " leading space", "a\n\n\nb", "emoji 🤖 ümlaut 12345",
             "<start_of_turn>user\nHi<end_of_turn>\n", "def f(x):\n    return x ** 2  # square", "日本語のテキスト"]
    for text in texts:
        assert tokenizer.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
