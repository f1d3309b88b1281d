"""The prefix-routing benchmark's workload is what docs/benchmarks.md says it is (its figures need a run)."""

from __future__ import annotations

import argparse

from flotilla_gateway.bench.prefix_routing import ALPHABET, default_kv_blocks, summarize, workload
from flotilla_server.model.tiny import build_tiny_tokenizer


def args(**overrides: object) -> argparse.Namespace:
    defaults = {"tenants": 6, "system_tokens": 1024, "question_tokens": 32, "output_tokens": 16, "requests": 180,
                "slots": 4, "replicas": 3, "concurrency": 12, "num_kv_blocks": 152, "max_model_len": 1280,
                "endpoint": "chat", "runs": 3, "seed": 0, "arms": ("prefix", "round-robin")}
    return argparse.Namespace(**{**defaults, **overrides})


def test_system_prompts_are_one_tiny_token_per_character():
    tokenizer = build_tiny_tokenizer()
    prompt = workload(args(), seed=0)[0].system
    assert set(prompt) <= set(ALPHABET)
    assert len(tokenizer.encode(prompt)) == 1024 + 1  # + BOS: no merge joins two of these characters


def test_six_tenants_share_180_requests_with_unique_questions_and_fresh_prompts_per_seed():
    requests = workload(args(), seed=0)
    assert len(requests) == 180 and len({r.question for r in requests}) == 180
    assert len({r.system for r in requests}) == 6 == len({r.tenant for r in requests})
    assert {r.system for r in workload(args(), seed=1)}.isdisjoint({r.system for r in requests})


def test_the_kv_pool_holds_two_system_prompts_and_a_full_batch():
    assert default_kv_blocks(args()) == 2 * 64 + 4 * 6


def test_the_summary_is_the_median_per_arm_against_the_targets():
    def run(arm: str, hit: float, ttft_ms: float, balance: float) -> dict:
        return {"arm": arm, "prefix_hit_rate": hit, "ttft_p50_ms": ttft_ms, "ttft_p95_ms": ttft_ms,
                "e2e_p50_ms": ttft_ms, "elapsed_s": 1.0, "in_flight_max_over_mean": balance}

    runs = [run("prefix", 0.9, 100, 1.2), run("prefix", 0.85, 120, 1.4), run("prefix", 0.5, 900, 1.9),
            run("round-robin", 0.3, 300, 1.0), run("round-robin", 0.35, 260, 1.1), run("round-robin", 0.4, 200, 1.0)]
    summary = summarize(args(), runs)
    assert summary["medians"]["prefix"]["prefix_hit_rate"] == 0.85
    assert summary["ttft_p50_ratio_round_robin_over_prefix"] == round(260 / 120, 3)
    assert summary["targets"] == {"prefix_hit_rate_at_least_0.8": True, "ttft_p50_at_least_2x_lower": True,
                                  "in_flight_max_over_mean_at_most_1.5": True}
