"""`flotilla-bench steps`: every part of a decode step is reported, and the parts add up to the step."""

from __future__ import annotations

import json

import torch.nn.functional as F
from flotilla_server.bench.cli import main
from flotilla_server.bench.step_profile import ENGINE_PARTS, FORWARD_PARTS
from flotilla_server.model import DecoderModel, KVCacheTensors


def test_steps_reports_each_part_for_each_batch(tmp_path, capsys) -> None:
    originals = (KVCacheTensors.gather_blocks, KVCacheTensors.write, F.scaled_dot_product_attention,
                 DecoderModel.compute_logits)
    out = tmp_path / "steps.json"
    plot = tmp_path / "steps.png"
    argv = ["steps", "--model", "tiny", "--batch", "1", "--batch", "3", "--context", "20", "--steps", "3",
            "--json", str(out), "--plot", str(plot), "--dtype", "bfloat16"]
    assert main(argv) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(out.read_text())
    assert report["dtype"] == "bfloat16"
    batches = report["models"]["tiny"]["batches"]
    assert set(batches) == {"1", "3"}
    for b in batches.values():
        assert b["decode_tokens_per_s"] > 0 and 0 < b["forward_fraction"] <= 1
        split = b["split"]
        assert all(split[p] > 0 for p in ("forward_s", *FORWARD_PARTS, *ENGINE_PARTS))
        parts = split["forward_s"] + sum(split[p] for p in ENGINE_PARTS) + split["other_s"]
        assert abs(parts - split["step_s"]) < 1e-9
    # the timers are gone once the profile is done
    assert originals == (KVCacheTensors.gather_blocks, KVCacheTensors.write, F.scaled_dot_product_attention,
                         DecoderModel.compute_logits)
    assert "detokenize" in capsys.readouterr().out


def test_steps_refuses_a_zero_batch(capsys) -> None:
    assert main(["steps", "--batch", "0"]) == 2
    assert "--batch" in capsys.readouterr().err
