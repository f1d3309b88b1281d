"""flotilla-bench online end to end against a real server: Poisson arrivals, cancellations, JSON and PNG."""

from __future__ import annotations

import json
import shlex
import time

from flotilla_server.bench.cli import main as bench_main

from tests.docs.doc_blocks import ROOT


def test_online_bench_poisson_with_cancellations(server, tmp_path):
    gone_before = server.metric("flotilla_rejections_total", reason="client_gone")
    ok_before = server.metric("flotilla_requests_total", code="200")
    out_json, out_png = tmp_path / "run.json", tmp_path / "run.png"
    code = bench_main(["online", "--base-url", server.base_url, "--num-requests", "24", "--request-rate", "40",
                       "--concurrency", "16", "--output-len-min", "16", "--output-len-max", "48",
                       "--cancel-share", "0.25", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000",
                       "--endpoint", "chat", "--json", str(out_json), "--plot", str(out_png), "--no-progress"])
    assert code == 0
    report = json.loads(out_json.read_text())
    s = report["summary"]
    counts = s["status_counts"]
    assert counts.get("cancelled", 0) >= 2 and counts.get("200", 0) + counts.get("cancelled", 0) == 24, counts
    assert s["completed"] == counts["200"] and s["output_token_throughput_per_s"] > 0
    assert s["goodput_requests_per_s"] == s["request_throughput_per_s"]  # SLOs every request meets
    assert s["ttft_ms"]["p50"] is not None and s["itl_ms"]["p99"] >= s["itl_ms"]["p50"]
    assert len(report["requests"]) == 24
    assert out_png.stat().st_size > 10_000
    # each request ends on the server as a 200 or a client departure (a cancellation may come after the server
    # already sent everything into the socket: then it is a 200 there)
    def ended() -> tuple[float, float]:
        return (server.metric("flotilla_requests_total", code="200") - ok_before,
                server.metric("flotilla_rejections_total", reason="client_gone") - gone_before)

    deadline = time.monotonic() + 10
    while sum(ended()) < 24:
        assert time.monotonic() < deadline, ended()
        time.sleep(0.1)
    ok, gone = ended()
    assert ok + gone == 24 and gone <= counts["cancelled"]


def test_online_bench_explains_bad_arguments(capsys):
    assert bench_main(["online", "--cancel-share", "2"]) == 2
    assert "--cancel-share must be in [0, 1]" in capsys.readouterr().err


def test_the_documented_quick_run(server, capsys):
    """docs/benchmarks.md's `--quick` smoke run, against the test's server instead of one of its own."""
    (line,) = [line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
               if line.startswith("flotilla-bench online") and "--quick" in line]
    words = shlex.split(line)[1:]
    words[words.index("--base-url") + 1] = server.base_url
    assert bench_main(words) == 0
    assert "requests: 16  completed: 16" in capsys.readouterr().out
