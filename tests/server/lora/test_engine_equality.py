"""LoRA adapters through the engine (EngineCore): greedy tokens equal peft's (the adapter applied to the base on
transformers, unmerged) for three adapters of ranks 4, 8 and 16 on two architectures: each adapter alone, all
of them in mixed batches with base-model requests, with chunked prefill, and with fewer slots than adapters
(sequences wait for a slot, are never refused, and adapters are evicted least recently used)."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model

from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter, peft_model

RANKS = (4, 8, 16)
NAMES = tuple(f"r{rank}" for rank in RANKS)
MAX_NEW_TOKENS = 8
PROMPTS = random_prompts([5, 11, 23, 37], seed=3)


def peft_greedy(base, adapter, prompts, max_new_tokens: int) -> list[list[int]]:
    """peft's greedy tokens (transformers generate, do_sample=False), one prompt at a time, EOS ignored."""
    model = peft_model(base, adapter)
    model.generation_config.eos_token_id = None
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                       min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
            out.append(generated[0, len(prompt):].tolist())
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def served(request, tmp_path_factory):
    """(LoadedModel, --lora specs, expected tokens by model name (None: the base) and prompt number)."""
    root = tmp_path_factory.mktemp(f"lora-engine-{request.param}")
    base = make_hf_model_dir(request.param, root / "base")
    specs = tuple((name, str(make_lora_adapter(base, root / name, rank=rank, seed=rank)))
                  for name, rank in zip(NAMES, RANKS, strict=True))
    expected = {None: hf_greedy(base, PROMPTS, MAX_NEW_TOKENS)}
    for name, path in specs:
        expected[name] = peft_greedy(base, path, PROMPTS, MAX_NEW_TOKENS)
    return load_model(str(base), "float32", "cpu"), specs, expected


def run(served, requests: list[tuple[str | None, int]], **config) -> tuple[dict[str, list[int]], EngineCore]:
    """Every (adapter, prompt number) request added at once, greedy, stepped to the end."""
    loaded, specs, _ = served
    engine = EngineCore(EngineConfig(model="unused", loras=specs, max_lora_rank=16, num_kv_blocks=64, **config),
                        loaded=loaded)
    tokens: dict[str, list[int]] = {}
    for n, (adapter, i) in enumerate(requests):
        rid = f"{adapter}-{i}-{n}"
        tokens[rid] = []
        engine.add_request(rid, PROMPTS[i], SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0,
                                                           ignore_eos=True, lora=adapter))
    for _ in range(1000):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    assert not engine.has_unfinished()
    return tokens, engine


def check(served, tokens: dict[str, list[int]]) -> None:
    expected = served[2]
    for rid, got in tokens.items():
        adapter, i, _ = rid.rsplit("-", 2)
        assert got == expected[None if adapter == "None" else adapter][int(i)], rid


def test_each_adapter_alone_answers_as_peft_and_differs_from_the_base(served):
    expected = served[2]
    for name in NAMES:
        tokens, _ = run(served, [(name, i) for i in range(len(PROMPTS))])
        check(served, tokens)
        differs = sum(expected[name][i] != expected[None][i] for i in range(len(PROMPTS)))
        assert differs >= len(PROMPTS) - 1, (name, differs)


def test_one_mixed_batch_of_every_adapter_and_the_base_answers_as_peft(served):
    requests = [(adapter, i) for i in range(len(PROMPTS)) for adapter in (None, *NAMES)]
    tokens, engine = run(served, requests, max_loras=4)
    check(served, tokens)
    stats = engine.stats()
    assert (stats.adapter_loads, stats.adapter_evictions) == (3, 0)


def test_chunked_prefill_with_adapters_answers_as_peft(served):
    requests = [(adapter, i) for i in (3, 2, 0) for adapter in (*NAMES, None)]
    tokens, _ = run(served, requests, prefill_chunk=8, max_num_batched_tokens=24, max_num_seqs=8)
    check(served, tokens)


def test_fewer_slots_than_adapters_waits_for_a_slot_and_evicts_the_least_recently_used(served):
    requests = [(adapter, i) for adapter in (*NAMES, None, NAMES[0]) for i in (1, 2)]
    tokens, engine = run(served, requests, max_loras=2)
    check(served, tokens)  # every request answered, none refused for want of a slot
    stats = engine.stats()
    assert stats.adapter_loads >= 3 and stats.adapter_evictions >= 1
    assert stats.adapter_loads - stats.adapter_evictions == len(stats.adapters_resident) <= 2
