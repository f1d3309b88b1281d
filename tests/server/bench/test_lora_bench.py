"""`flotilla-bench lora --small`: the documented quick run serves 8 adapters beside the base, answers every request
of both workloads in every round, and writes the report's fields and a plot; the files it serves are a Hugging
Face directory transformers reads and adapters peft reads, factor for factor."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from flotilla_server.bench.cli import main
from flotilla_server.bench.lora_files import ALL_TARGETS, write_adapter, write_base
from flotilla_server.bench.workloads import build_model, to_transformers
from flotilla_server.model.lora_adapter import load_adapter
from safetensors.torch import load_file

from tests.docs.doc_blocks import ROOT


def documented_small_command(tmp_path) -> list[str]:
    """docs/benchmarks.md's quick command, its output paths moved under tmp_path."""
    (line,) = [line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
               if line.startswith("flotilla-bench lora --small")]
    words = shlex.split(line)[1:]
    return [str(tmp_path / word.rsplit("/", 1)[-1]) if word.startswith("bench-results/") else word for word in words]


def test_the_documented_small_run_answers_every_request_and_reports_both_workloads(tmp_path, capsys):
    command = documented_small_command(tmp_path)
    assert main(command) == 0
    report = json.loads((tmp_path / "lora-small.json").read_text())
    c = report["config"]
    assert (c["mode"], c["model"], c["adapters"], c["rank"], c["max_loras"]) == ("small", "llama-small", 8, 16, 8)
    assert c["adapter_names"] == [f"lora-{i}" for i in range(8)] and c["served_model"] == "llama-small"
    runs = report["runs"]
    assert [(r["round"], r["workload"]) for r in runs] == [(1, "base"), (1, "adapters"), (2, "adapters"), (2, "base")]
    for r in runs:
        assert r["answered"] == r["requests"] == c["requests"], r
        assert r["tokens"] == c["requests"] * c["output_len"] and r["tokens_per_s"] > 0
        assert r["models"] == (1 if r["workload"] == "base" else 8)
    assert report["answered"] == report["requests"] == 4 * c["requests"]
    medians = report["median_tokens_per_s"]
    assert report["ratio"] == pytest.approx(medians["adapters"] / medians["base"])
    assert report["target"]["ratio"] == 0.7 and report["target"]["goal"] == 0.85
    m = report["memory"]
    assert m["adapters_bytes"] == m["adapter_slot_bytes"] + m["adapter_host_bytes"]
    assert m["model_copies_bytes"] == 8 * m["model_weight_bytes"] and 0 < m["adapters_over_copies"] < 1
    assert report["cpu"]["cpus"] >= 1
    if report["adapter_cache"] is not None:  # where the server exports its adapter metrics
        assert report["adapter_cache"] == {"loads": 8, "evictions": 0}  # each adapter into its slot once
    assert (tmp_path / "lora-small.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "adapters / base:" in out and "answered: 64/64" in out


def test_the_files_are_what_transformers_and_peft_read(tmp_path):
    """The base equals the in-process model under transformers; each adapter's factors, as peft loads them, are
    those written (peft names a missing factor only by a warning, and would then keep its random init), and
    the server's reader takes it with every target module of every layer."""
    import transformers
    from peft import PeftModel

    base = write_base("llama-small", tmp_path / "base")
    adapter = write_adapter(base, tmp_path / "a", rank=16, seed=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    ids = torch.tensor([[380, 5, 70, 200, 33]])
    with torch.inference_mode():
        base_logits = hf(ids).logits
        assert torch.equal(base_logits, to_transformers(build_model("llama-small")).eval()(ids).logits)
    written = load_file(adapter / "adapter_model.safetensors")
    peft = PeftModel.from_pretrained(hf, adapter).eval()  # wraps hf's own modules
    loaded = {k.replace(".default.", "."): v for k, v in peft.state_dict().items() if ".lora_" in k}
    assert loaded.keys() == written.keys() and len(written) == 2 * len(ALL_TARGETS) * base.num_layers
    assert all(torch.equal(loaded[k], written[k]) for k in written)
    served = load_adapter("a", str(adapter), base, 16)
    assert len(served.modules) == len(ALL_TARGETS) * base.num_layers and served.max_rank == 16
    with torch.inference_mode():
        assert not torch.allclose(peft(ids).logits, base_logits, atol=1e-3)  # the adapter moves the output


def test_bad_options_are_named(capsys):
    assert main(["lora", "--small", "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
    assert main(["lora", "--small", "--output-len", "300"]) == 2
    assert "--output-len must be <= 192" in capsys.readouterr().err
