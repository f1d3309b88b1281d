"""Prefix caching per adapter (engine/block_hash.py): an adapter's KV blocks are keyed by its name, so two
adapters, or an adapter and the base, never share a block; one adapter's requests do share theirs."""

from __future__ import annotations

from flotilla_server.engine.block_hash import extend_hashes
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model

from tests.support.hf_models import make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

BLOCK = 16


def test_block_hashes_differ_by_adapter_and_by_salt_and_never_collide():
    tokens = list(range(3 * BLOCK))
    keys = [(None, None), ("a", None), ("b", None), ("a", "s"), (None, "s"), ("ab", None)]
    chains = {k: extend_hashes([], tokens, BLOCK, k[1], k[0]) for k in keys}
    seen = [h for chain in chains.values() for h in chain]
    assert len(set(seen)) == len(seen)
    assert extend_hashes([], tokens, BLOCK, None, None) == extend_hashes([], tokens, BLOCK, None)  # base unchanged


def run_one(engine: EngineCore, rid: str, prompt: list[int], adapter: str | None) -> tuple[list[int], int]:
    """Greedy tokens of one request, and the prefix-cache hit tokens it added."""
    hits = engine.stats().prefix_cache_hits
    engine.add_request(rid, prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, lora=adapter))
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
    return tokens, engine.stats().prefix_cache_hits - hits


def test_an_adapter_never_reuses_another_s_or_the_base_s_blocks(tmp_path):
    base = make_hf_model_dir("llama", tmp_path / "base")
    specs = tuple((n, str(make_lora_adapter(base, tmp_path / n, rank=4, seed=s))) for n, s in (("a", 1), ("b", 2)))
    engine = EngineCore(EngineConfig(model="unused", loras=specs, num_kv_blocks=64, block_size=BLOCK),
                        loaded=load_model(str(base), "float32", "cpu"))
    prompt = random_prompts([3 * BLOCK + 5], seed=7)[0]
    base_alone, hit = run_one(engine, "base-1", prompt, None)
    assert hit == 0
    a_first, hit = run_one(engine, "a-1", prompt, "a")
    assert hit == 0  # the base's blocks hold the base's keys and values: never the adapter's
    b_first, hit = run_one(engine, "b-1", prompt, "b")
    assert hit == 0
    a_again, hit = run_one(engine, "a-2", prompt, "a")
    assert hit == 3 * BLOCK and a_again == a_first  # its own blocks are shared, with the same answer
    base_again, hit = run_one(engine, "base-2", prompt, None)
    assert hit == 3 * BLOCK and base_again == base_alone
    assert a_first != base_alone and b_first != a_first
