"""A shared pool holds 4x more models when they keep their GGUF blocks: a memory budget that holds exactly two
float32 SmolLM2-135M-Instruct models (their packed copies counted) holds eight served from the same Q4_1 file
with `--quantization gguf` (the default for a .gguf), each with a 32 MiB KV pool. All eight answer over HTTP,
none is evicted, the engine processes' summed PSS stays within the budget, and /v1/models shows what each
holds (docs/models.md, "Quantization"; docs/serving.md, "Multi-model mode").
"""

from __future__ import annotations

from pathlib import Path

import httpx
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.engine_processes import EngineProcesses

from tests.server.http.server_process import run_server
from tests.server.model.gguf_reference import smollm2_gguf
from tests.server.model_cache.test_pool_sources import chat, samples
from tests.support.processes import pss_bytes

KV_BYTES = 32 * 2**20
MODELS = [f"smol-{i}" for i in range(8)]


def test_a_budget_of_two_float32_models_holds_eight_quantized_and_all_answer(tmp_path):
    gguf = str(smollm2_gguf())
    dense = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES, quantization="none")).footprint_bytes(gguf)
    budget = 2 * dense  # exactly two float32 models
    quantized = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES)).footprint_bytes(gguf)
    assert 3 * dense > budget >= 8 * quantized, (dense, quantized)
    listing = tmp_path / "models"
    listing.write_text("".join(f"{name}={gguf}\n" for name in MODELS))
    with run_server("--memory-budget", str(budget), "--kv-cache-memory", str(KV_BYTES), "--max-model-len", "256",
                    "--max-num-seqs", "2", "--min-residency-s", "0", tmp_path=tmp_path,
                    model_args=("--model-list-file", str(listing))) as server:
        for name in MODELS:
            assert "Paris" in chat(server, name), name  # each one the real model, from its blocks
        cards = {m["id"]: m for m in httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]}
        assert all(cards[name]["state"] == "loaded" for name in MODELS), cards
        assert not [s for s in samples(server, "flotilla_model_evictions_total") if s.value], "a model was evicted"
        engines_pss = pss_bytes(server.proc.pid, include_root=False)
        assert engines_pss <= budget, (engines_pss, budget)
        file_bytes = Path(gguf).stat().st_size
        for name in MODELS:
            assert cards[name]["quantization"] == "gguf:Q4_1+Q8_0"
            assert cards[name]["weight_bytes"] <= 1.3 * file_bytes
            assert cards[name]["memory_bytes"] == quantized  # charged what was predicted before the load
        held = {s.labels["model"]: s for s in samples(server, "flotilla_model_weight_bytes")}
        assert set(held) == set(MODELS) and all(s.labels["quantization"] == "gguf:Q4_1+Q8_0" for s in held.values())
        print(f"budget {budget / 2**20:.0f} MiB (2 x {dense / 2**20:.0f}), 8 x {quantized / 2**20:.0f} MiB charged, "
              f"engine processes' PSS {engines_pss / 2**20:.0f} MiB")
