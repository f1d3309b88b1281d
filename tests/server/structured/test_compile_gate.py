"""The compile gate (grammar/compile_gate.py) with real probe processes on tiny's tokenizer: one compile per
new grammar however many requests ask at once, an LRU of outcomes, at most N compiles at once, and a compile
past the limit killed, refused naming the limit, and refused at once the next time; over HTTP, that refusal is
a 400 naming the flag, and the server serves on."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest
from flotilla_server.grammar.compile_gate import COMPILED, CompileGate, CompileLimits, GrammarRefused
from flotilla_server.grammar.json_schema import schema_grammar
from flotilla_server.grammar.tokenizer_info import GrammarTokenizer
from flotilla_server.model.tiny import build_tiny_tokenizer

from tests.server.http.server_process import run_server
from tests.server.structured.pathological import nested_schema


class Counts:
    def __init__(self) -> None:
        self.hits = self.misses = 0
        self.compiles: list[str] = []

    def grammar_lookup(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1

    def grammar_compiled(self, outcome: str, seconds: float) -> None:
        self.compiles.append(outcome)


@pytest.fixture(scope="module")
def tokenizer() -> GrammarTokenizer:
    tok = build_tiny_tokenizer()
    return GrammarTokenizer(tok.to_json(), tok.vocab_size, tuple(tok.eos_token_ids))


def grammar(i: int) -> str:
    return schema_grammar({"type": "object", "properties": {f"k{i}": {"type": "integer"}}}, "s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_concurrent_requests_for_one_new_grammar_compile_it_once_then_it_costs_nothing(tokenizer) -> None:
    counts = Counts()

    async def go() -> None:
        gate = CompileGate(tokenizer, CompileLimits(), counts)
        await asyncio.gather(*(gate.check(grammar(0)) for _ in range(5)))
        await gate.check(grammar(0))
        await gate.close()
        assert gate.num_probes == 0

    asyncio.run(go())
    assert counts.compiles == [COMPILED] and (counts.misses, counts.hits) == (1, 5)


def test_the_outcomes_are_an_lru_and_at_most_n_compiles_run_at_once(tokenizer) -> None:
    counts = Counts()

    async def go() -> None:
        gate = CompileGate(tokenizer, CompileLimits(max_concurrent=2, cache_size=3), counts)
        await asyncio.gather(*(gate.check(grammar(i)) for i in range(6)))
        assert gate.probes_started == 2  # six compiles, never more than two processes
        for i in (10, 11, 12, 13):  # one after another: 10 is evicted by 13
            await gate.check(grammar(i))
        await gate.check(grammar(13))  # kept
        await gate.check(grammar(10))  # evicted: compiled again
        await gate.close()

    asyncio.run(go())
    assert counts.compiles == [COMPILED] * 11


def test_a_compile_past_the_limit_is_killed_refused_naming_the_limit_and_refused_at_once_again(tokenizer) -> None:
    counts = Counts()
    slow = schema_grammar(nested_schema(8), "s")

    async def go() -> None:
        gate = CompileGate(tokenizer, CompileLimits(timeout_s=0.05), counts)
        await gate.check(grammar(1))  # starts the probe process
        (probe,) = gate._idle
        with pytest.raises(GrammarRefused, match=r"limit of 0\.05 s \(--grammar-compile-timeout-s\)") as e:
            await gate.check(slow)
        assert e.value.timed_out
        assert not alive(probe.proc.pid) and gate.num_probes == 0  # killed: its core is free
        start = time.perf_counter()
        with pytest.raises(GrammarRefused):
            await gate.check(slow)
        assert time.perf_counter() - start < 0.05  # no second compile
        await gate.check(grammar(2))  # a new probe serves the next grammar
        await gate.close()

    asyncio.run(go())
    assert counts.compiles == [COMPILED, "timeout", COMPILED]


def test_an_unsupported_keyword_is_refused_naming_it(tokenizer) -> None:
    async def go() -> None:
        gate = CompileGate(tokenizer, CompileLimits())
        with pytest.raises(GrammarRefused, match="uniqueItems") as e:
            await gate.check(schema_grammar({"type": "array", "uniqueItems": True}, "s"))
        assert not e.value.timed_out
        await gate.close()

    asyncio.run(go())


def test_a_compile_past_the_limit_is_a_400_naming_it_and_the_server_serves_on(tmp_path) -> None:
    with run_server("--grammar-compile-timeout-s", "0.05", tmp_path=tmp_path) as s:
        body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested_schema(8)}}}
        r = httpx.post(f"{s.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "--grammar-compile-timeout-s" in error["message"] and error["code"] == "grammar_compile_timeout"
        # a request without a grammar: any compile, even json_object's, can outrun 0.05 s on a loaded machine
        # (make test once refused one so, at a load average of 7)
        plain = {k: v for k, v in body.items() if k != "response_format"}
        ok = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=60, json=plain)
        assert ok.status_code == 200, ok.text
        assert s.metric("flotilla_grammar_compile_seconds_count", outcome="timeout") == 1


def test_a_probe_that_died_fails_its_request_only_and_the_next_starts_a_new_one(tokenizer) -> None:
    async def go() -> None:
        gate = CompileGate(tokenizer, CompileLimits())
        await gate.check(grammar(20))
        (probe,) = gate._idle
        probe.proc.kill()  # as the OOM killer would
        await probe.proc.wait()
        with pytest.raises((OSError, EOFError)):  # the HTTP side answers 503 grammar_compiler_unavailable
            await gate.check(grammar(21))
        assert gate.num_probes == 0
        await gate.check(grammar(21))  # retried: a new probe
        assert gate.probes_started == 2
        await gate.close()

    asyncio.run(go())
