"""`flotilla-bench prefix` on a small model: caching computes each system prompt once, output unchanged."""

from __future__ import annotations

import json

import pytest
from flotilla_server.bench.cli import main

pytestmark = pytest.mark.slow  # seconds here; -m 'not slow' skips it


def test_prefix_bench_smoke_reaches_the_ceiling(tmp_path) -> None:
    out = tmp_path / "prefix.json"
    args = ["prefix", "--model", "llama-small", "--num-requests", "12", "--num-prefixes", "3", "--prefix-len", "128",
            "--question-len", "16", "--output-len", "4", "--concurrency", "3", "--runs", "1", "--json", str(out), "--plot", str(tmp_path / "prefix.png")]
    assert main(args) == 0
    assert (tmp_path / "prefix.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads(out.read_text())
    off, on = report["median_off"], report["median_on"]
    assert off["prefill_tokens"] == 12 * (128 + 16)  # without the cache every prompt is prefilled whole
    # with it, each system prompt's full blocks once; the rest is questions and each prompt's partial block
    assert report["prefill_tokens_ratio"] > 0.8 * report["ceiling_prefill_ratio"]
    assert on["output_tokens_per_s"] > 0
