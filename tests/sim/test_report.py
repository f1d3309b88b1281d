from flotilla_sim import report


def _result(gpu_hours, attainment):
    nan = float("nan")
    return {"gpu_hours": gpu_hours, "slo_attainment": {f"{t:g}": a for t, a in attainment.items()},
            "requests": {"rejected_429": 0, "rejected_503": 0}, "ttft_s": {"p50": 0.04, "p99": 0.1},
            "e2e_s": {"p50": 1.0, "p99": 2.0}, "cold_starts": 0, "cold_start_wait_s": {"p50": nan, "p99": nan}}


def test_the_cheapest_policy_meeting_a_target_wins_by_its_margin_over_the_next():
    targets = (0.2, 0.5, 1.0, 2.0, 5.0)
    results = {
        "fast": _result(100.0, dict.fromkeys(targets, 0.999)),
        "cheap": _result(60.0, {0.2: 0.5, 0.5: 0.7, 1.0: 0.9, 2.0: 0.995, 5.0: 1.0}),
        "waste": _result(300.0, dict.fromkeys(targets, 1.0)),
    }
    by_target = {v["ttft_target_s"]: v for v in report.verdicts(results)}
    assert by_target[1.0]["winner"] == "fast" and by_target[1.0]["runner_up"] == "waste"
    assert by_target[2.0]["winner"] == "cheap" and by_target[2.0]["saving_gpu_hours"] == 40.0
    assert by_target[2.0]["saving_share"] == 0.4
    text = report.markdown(results, {}, "test profile")
    assert "cheap wins with 60 GPU-hours, 40 (40%) fewer than fast" in text
