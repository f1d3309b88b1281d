"""/metrics: every metric of the issue's table and the Gateway API Inference Extension gauges, each labelled
with the model, with values that follow real traffic."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

EXPECTED = {
    "flotilla_requests_waiting": "gauge", "flotilla_requests_running": "gauge", "flotilla_slots": "gauge",
    "flotilla_kv_blocks_total": "gauge", "flotilla_kv_blocks_used": "gauge", "flotilla_kv_cache_usage_ratio": "gauge",
    "flotilla_requests": "counter", "flotilla_rejections": "counter", "flotilla_prompt_tokens": "counter",
    "flotilla_generation_tokens": "counter", "flotilla_preemptions": "counter",
    "flotilla_time_to_first_token_seconds": "histogram", "flotilla_inter_token_latency_seconds": "histogram",
    "flotilla_request_duration_seconds": "histogram", "flotilla_queue_wait_seconds": "histogram",
    "flotilla_step_duration_seconds": "histogram", "flotilla_step_tokens": "histogram",
    "vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "flotilla_kv_blocks_cached": "gauge", "flotilla_prefix_cache_queries": "counter",
    "flotilla_prefix_cache_hits": "counter", "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
}


def test_every_metric_is_exported_with_the_model_label(server):
    r = httpx.post(f"{server.base_url}/v1/completions",
                   json={"model": "tiny", "prompt": "count me", "max_tokens": 5, "ignore_eos": True}, timeout=30)
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.base_url}/metrics").text)}
    for name, kind in EXPECTED.items():
        assert name in families, f"{name} missing"
        assert families[name].type == kind, (name, families[name].type)
        assert families[name].samples, name
        for sample in families[name].samples:
            assert sample.labels.get("model") == "tiny", sample
    reasons = {s.labels["reason"] for s in families["flotilla_rejections"].samples}
    assert reasons == {"queue_full", "queue_timeout", "infeasible", "draining", "client_gone", "slow_client",
                       "tenant_limit"}
    assert not [n for n in families if n.endswith("_created")]
    m = server.metrics()
    assert m[("flotilla_slots", ())] == 64
    assert m[("flotilla_kv_blocks_total", ())] > 0
    assert m[("flotilla_generation_tokens_total", ())] >= 5
    assert m[("flotilla_time_to_first_token_seconds_count", ())] >= 1
    assert m[("flotilla_step_tokens_sum", ())] >= 5
    assert m[("flotilla_requests_total", (("code", "200"),))] >= 1
