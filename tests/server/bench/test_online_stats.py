"""flotilla-bench online's figures, checked against hand-computed values; the SSE chunk encoder."""

from __future__ import annotations

import pytest
from flotilla_server.bench.online_stats import RequestRecord, summarize
from flotilla_server.http.reply import DeltaEncoder, chat_chunk, completion_chunk, sse_event
from hypothesis import given
from hypothesis import strategies as st


def _rec(status="200", ttft=0.1, e2e=1.0, out=10, prompt=5, chunks=(0.1, 0.2, 0.4)):
    return RequestRecord(start_s=0.0, status=status, prompt_tokens=prompt, output_tokens=out, ttft_s=ttft,
                         e2e_s=e2e, chunk_times_s=list(chunks))


def test_throughputs_counts_and_latencies():
    recs = [_rec(), _rec(ttft=0.3, e2e=2.8), _rec(status="429", out=0, ttft=None, e2e=None, chunks=()),
            _rec(status="cancelled", e2e=None)]
    s = summarize(recs, duration_s=2.0)
    assert s["status_counts"] == {"200": 2, "429": 1, "cancelled": 1}
    assert s["completed"] == 2
    assert s["request_throughput_per_s"] == pytest.approx(1.0)
    assert s["output_token_throughput_per_s"] == pytest.approx(10.0)
    assert s["total_token_throughput_per_s"] == pytest.approx(15.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    # TPOT = (e2e - ttft) / (out - 1): 0.9/9 = 100 ms and 2.5/9 ≈ 277.8 ms
    assert s["tpot_ms"]["mean"] == pytest.approx((100.0 + 2500.0 / 9) / 2)
    assert s["itl_ms"]["p50"] == pytest.approx(150.0)  # gaps 100, 200 for each record


def test_goodput_counts_only_requests_meeting_every_slo():
    recs = [_rec(ttft=0.1, e2e=1.0), _rec(ttft=0.5, e2e=1.4), _rec(ttft=0.1, e2e=5.0)]
    s = summarize(recs, duration_s=1.0, slo_ttft_ms=200, slo_tpot_ms=150)
    assert s["slo"]["met"] == 1
    assert s["goodput_requests_per_s"] == pytest.approx(1.0)
    assert summarize(recs, 1.0)["goodput_requests_per_s"] == pytest.approx(3.0)


def test_empty_run_has_no_percentiles():
    s = summarize([], duration_s=1.0)
    assert s["ttft_ms"]["p99"] is None and s["completed"] == 0


@given(st.text())
def test_delta_encoder_matches_the_plain_encoding(text):
    make = lambda t: completion_chunk("cmpl-1", 5, "tiny", t)  # noqa: E731
    assert DeltaEncoder(make)(text) == sse_event(make(text))
    chat = lambda t: chat_chunk("c-1", 5, "tiny", {"content": t})  # noqa: E731
    assert DeltaEncoder(chat)(text) == sse_event(chat(text))
