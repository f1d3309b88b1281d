"""flotilla-bench priorities' figures and targets, checked by hand; no flotilla-server is started."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest
from flotilla_contract.classes import BATCH, TENANT_LIMIT, parse_weights
from flotilla_server.bench import priorities as p
from flotilla_server.bench.cli import main
from flotilla_server.bench.priorities_report import (
    CASES,
    SHARE_WEIGHTS,
    Rec,
    case_rows,
    clean,
    format_case,
    medians,
    paired_ratios,
    pct,
    plot,
    summarise,
)


def _args(**kw) -> argparse.Namespace:
    base = {"samples": 200, "interval_s": 0.1, "chat_tokens": 16, "flood": 150, "batch_tokens": 256,
            "share_concurrency": 32, "closed_tokens": 64, "tenant_max_running": 8, "tenant_max_queued": 8,
            "tenant_flood": 64, "light_interval_s": 0.5}
    return argparse.Namespace(**(base | kw))


def test_pct_is_nearest_rank_and_nan_when_empty():
    values = list(range(1, 101))  # 1..100
    assert pct(values, 0.5) == 50 and pct(values, 0.95) == 95 and pct(values, 0.99) == 99
    assert pct([7.0], 0.99) == 7.0 and pct([3, 1, 2], 0.0) == 1
    assert math.isnan(pct([], 0.5))


def test_summarise_counts_refusals_ttft_tokens_and_shares():
    recs = [
        Rec("interactive", 1.0, 200, first_token_s=1.02, tokens=16, window_tokens=16),
        Rec("interactive", 2.0, 200, first_token_s=2.04, tokens=16, window_tokens=16),
        Rec("interactive", 3.0, 429, code="queue_full", retry_after=True),
        Rec("batch", 0.5, 200, first_token_s=0.6, tokens=256, window_tokens=96),  # first token before the window
        Rec("batch", 1.5, 200, first_token_s=1.7, tokens=100, window_tokens=100),
        Rec("batch", 1.6, 429, code=TENANT_LIMIT, retry_after=False),
        Rec("batch", 1.7, 200, code="slow_client", first_token_s=1.9, tokens=3, window_tokens=0),
    ]
    s = summarise(recs, (1.0, 3.0))
    assert s["interactive.requests"] == 3 and s["interactive.refused"] == 1 and s["interactive.429"] == 1
    assert s["interactive.codes"] == {"queue_full": 1} and s["interactive.429_no_retry_after"] == 0
    assert s["interactive.ttft_ms"] == pytest.approx([20.0, 40.0])
    assert s["interactive.ttft_p50_ms"] == pytest.approx(20.0) and s["interactive.ttft_p99_ms"] == pytest.approx(40.0)
    assert s["batch.tenant_limit"] == 1 and s["batch.429_no_retry_after"] == 1 and s["batch.stream_errors"] == 1
    assert s["batch.tokens_per_s"] == pytest.approx(98.0)  # 196 tokens in a 2 s window
    assert s["batch.token_share"] == pytest.approx(196 / 228) and s["interactive.token_share"] == pytest.approx(32 / 228)
    assert s["batch.admitted"] == 2 and s["batch.admission_share"] == pytest.approx(0.5)  # 2 of the 4 in the window


def test_medians_skip_nan_and_lists():
    runs = [{"a": 1.0, "b": math.nan, "l": [1, 2], "codes": {}}, {"a": 3.0, "b": 5.0}, {"a": 2.0, "b": math.nan}]
    assert medians(runs) == {"a": 2.0, "b": 5.0}
    assert math.isnan(medians([{"x": math.nan}])["x"])


def _med(idle_p95=10.0, classes_p95=14.0, fifo_p95=9000.0, alone=2000.0, mixed=1700.0, share=0.2,
         flood_b=30.0, cap_b=27.0) -> dict:
    return {
        "idle": {"interactive.ttft_p50_ms": 8.0, "interactive.ttft_p95_ms": idle_p95, "interactive.ttft_p99_ms": 12.0},
        "fifo": {"interactive.ttft_p95_ms": fifo_p95, "batch.429": 40.0},
        "classes": {"interactive.ttft_p95_ms": classes_p95, "interactive.ttft_samples": 200,
                    "batch.tokens_per_s": mixed, "batch.429": 30.0},
        "batch_alone": {"batch.tokens_per_s": alone},
        "light": {"batch.tokens_per_s": mixed},
        "share_8_1": {"batch.token_share": share, "batch.admission_share": share},
        "share_3_1": {"batch.token_share": share},
        "tenant_flood": {f"A.{TENANT_LIMIT}": 50.0, "B.ttft_p95_ms": flood_b},
        "tenant_cap": {"B.ttft_p95_ms": cap_b},
    }


def _runs(refused=0, med: dict | None = None) -> dict:
    med = med or _med()
    return {arm: [{"interactive.refused": refused, "A.429_no_retry_after": 0, "A.refused": 0, "B.refused": 0,
                   "batch.codes": {"queue_full": 3, "queue_timeout": 1}} | med[arm]] * 2 for arm in med}


def _met(rows: list[dict]) -> dict[str, bool | None]:
    return {r["label"]: r["met"] for r in rows if r["target"]}


def test_case_rows_meet_their_targets():
    med, runs = _med(), _runs()
    flood = case_rows("flood", med, runs, 200)
    assert all(_met(flood).values())
    by_code = next(r["value"] for r in flood if r["label"] == "classes: batch refusals by code (all runs)")
    assert by_code == "queue_full 6, queue_timeout 2"  # summed over both runs
    assert all(_met(case_rows("throughput", med, runs, 200)).values())
    assert all(_met(case_rows("tenants", med, runs, 200)).values())
    share = _met(case_rows("share", med, runs, 200))
    assert share == {"share_8_1 (8:1): batch share of output tokens": True, "share_8_1 (8:1): batch share of admissions": None,
                     "share_3_1 (3:1): batch share of output tokens": False, "share_3_1 (3:1): batch share of admissions": None}


def test_case_rows_miss_their_targets_and_say_when_an_arm_did_not_run():
    med = _med(classes_p95=16.0, mixed=1500.0, flood_b=33.0)
    flood = _met(case_rows("flood", med, _runs(refused=2), 200))
    assert flood["classes p95 / idle p95"] is False and flood["classes: interactive refused (all runs)"] is False
    assert _met(case_rows("throughput", med, _runs(med=med), 200))["light / alone, median of each run's pair"] is False
    assert _met(case_rows("tenants", med, _runs(), 200))["B p95 ratio, flood / cap"] is False
    del med["tenant_flood"]
    runs = _runs()
    del runs["tenant_flood"]
    tenants = _met(case_rows("tenants", med, runs, 200))
    assert tenants["B p95 ratio, flood / cap"] is None and tenants["tenant_cap: A refused (all runs)"] is True
    text = format_case("tenants", case_rows("tenants", med, runs, 200), ["tenant_flood"])
    assert "not run: tenant_flood" in text and "NOT MET" not in text


def test_every_case_names_arms_that_exist_and_the_arms_mark_what_they_should():
    arms = p.build_arms(_args())
    assert {a for _, names in CASES.values() for a in names} <= set(arms)
    assert [x.cls for x in arms["fifo"].loads] == [None, None]  # today's FIFO: nothing marked
    assert [x.cls for x in arms["classes"].loads] == [None, BATCH]
    assert arms["fifo"].flags == arms["classes"].flags == arms["share_8_1"].flags == ()  # the defaults
    flags = arms["share_3_1"].flags
    assert flags[0] == "--class-weights" and parse_weights(flags[1], what="x") == SHARE_WEIGHTS["share_3_1"]
    a_cap = next(x for x in arms["tenant_cap"].loads if x.name == "A")
    assert a_cap.mode == "closed" and a_cap.n == 8 and a_cap.tenant == "A"
    chat, light = arms["classes"].loads[0], arms["light"].loads[0]  # one window, a fifth of the requests
    assert light.n * light.interval_s == pytest.approx(chat.n * 0.1) and light.n == chat.n // 5


def test_payload_is_one_http_request_with_its_headers():
    load = p.Load("B", "open", 1, 16, chat=True, cls=BATCH, tenant="B")
    head, body = load.payload().split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nX-Flotilla-Class: batch" in head and b"\r\nX-Flotilla-Tenant: B" in head
    assert f"Content-Length: {len(body)}".encode() in head and b'"max_tokens": 16' in body


def test_post_reads_ttft_tokens_and_refusals_from_canned_answers():
    stream = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
              b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
              + b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' * 3
              + b'data: {"error":{"message":"m","code":"slow_client"}}\n\ndata: [DONE]\n\n')
    refusal = (b'HTTP/1.1 429 Too Many Requests\r\nretry-after: 30\r\ncontent-length: 40\r\n\r\n'
               b'{"error":{"code":"tenant_limit","x":1}}')

    async def go() -> list[Rec]:
        answers = iter([stream, refusal])

        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(next(answers))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        recs = [Rec("x", 0.0), Rec("x", 0.0)]
        for rec in recs:
            await p._post(port, b"GET / HTTP/1.1\r\n\r\n", rec, 0.0, (0.0, 1e12))
        server.close()
        return recs

    ok, refused = asyncio.run(go())
    assert ok.status == 200 and ok.tokens == ok.window_tokens == 3 and ok.code == "slow_client"
    assert ok.first_token_s is not None and ok.ttft_s >= 0
    assert (refused.status, refused.code, refused.retry_after, refused.tokens) == (429, TENANT_LIMIT, True, 0)


def test_unknown_arm_is_refused_before_any_server_starts(capsys):
    assert main(["priorities", "--arms", "idle,nope"]) == 2
    assert "unknown case or arm nope" in capsys.readouterr().err


def test_plot_draws_a_report_with_arms_missing(tmp_path):
    med = _med()
    del med["share_3_1"]
    runs = {"idle": [{"interactive.ttft_ms": [8.0, 9.0, 12.0]}], "classes": [{"interactive.ttft_ms": [10.0, 14.0]}]}
    report = clean({"config": {"slots": 16, "runs": 1}, "runs": runs, "medians": med | {"fifo": {"x": math.nan}}})
    assert report["medians"]["fifo"] == {"x": None}
    plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_throughput_target_pairs_each_runs_arms_so_drift_between_runs_cancels():
    """The host ran twice as fast in run 2: the medians' ratio misses the target, each run's pair meets it."""
    runs = {"batch_alone": [{"batch.tokens_per_s": 1000.0}, {"batch.tokens_per_s": 2000.0},
                            {"batch.tokens_per_s": 1900.0}],
            "light": [{"batch.tokens_per_s": 850.0}, {"batch.tokens_per_s": 1700.0},
                      {"batch.tokens_per_s": 1000.0}]}
    assert paired_ratios(runs, "light", "batch_alone", "batch.tokens_per_s") == pytest.approx([0.85, 0.85, 1000 / 1900])
    rows = {r["label"]: r for r in case_rows("throughput", {a: medians(r) for a, r in runs.items()}, runs, 200)}
    assert rows["light / alone, median of each run's pair"]["met"] is True
    assert rows["light / alone, each run's pair; ratio of the medians"]["value"][-1] == pytest.approx(1000 / 1900)
    assert paired_ratios({"light": runs["light"]}, "light", "batch_alone", "batch.tokens_per_s") == []
