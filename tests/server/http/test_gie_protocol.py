"""The Gateway API Inference Extension's model-server protocol, on a live server: `/health` answers as vLLM's does,
and `/metrics` read the way the extension's endpoint picker (EPP) reads it gives, under load, the values of
Flotilla's own gauges at the same scrape.

How the EPP reads a pod (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/backend/metrics/metrics.go, with
the vLLM mapping its pods' `inference.networking.k8s.io/engine-type: vllm` label selects): it parses the text
format, takes each mapped family by name, and reads the gauge value of its latest sample; `vllm:lora_requests_info`
is the sample with the largest value (a timestamp) among those whose running or waiting list is not empty, its
labels split on commas and `max_lora` parsed as an integer. A family of another type reads as 0 there, so the type
is part of the protocol.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from flotilla_contract import metrics as names
from prometheus_client.parser import text_string_to_metric_families
from safetensors.numpy import save_file

from tests.server.http.server_process import run_server

SLOTS = 2
MAX_LORAS = 1  # one adapter served from start: the server makes no more slots than adapters
ADAPTER = "sql"
# the protocol's gauges and the Flotilla gauge each must equal (docs/serving.md, "Metrics")
PROTOCOL_GAUGES = {names.VLLM_REQUESTS_WAITING: names.REQUESTS_WAITING,
                   names.VLLM_REQUESTS_RUNNING: names.REQUESTS_RUNNING,
                   names.VLLM_KV_CACHE_USAGE: names.KV_CACHE_USAGE_RATIO}
LORA_INFO = "vllm:lora_requests_info"


def write_tiny_adapter(path: Path, rank: int = 4) -> Path:
    """A PEFT LoRA adapter of the built-in `tiny` (hidden 256, 8 heads of 32) on layer 0's q_proj, written without
    peft: the server needs only adapter_config.json and the factors' shapes."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"], "bias": "none"}))
    rng = np.random.default_rng(0)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": rng.standard_normal((rank, 256), dtype=np.float32),
               f"{prefix}.lora_B.weight": rng.standard_normal((256, rank), dtype=np.float32)},
              str(path / "adapter_model.safetensors"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("gie")
    adapter = write_tiny_adapter(root / ADAPTER)
    with run_server("--max-num-seqs", str(SLOTS), "--max-model-len", "512", "--lora", f"{ADAPTER}={adapter}",
                    "--max-loras", str(MAX_LORAS), tmp_path=root) as s:
        yield s


def epp_read(text: str) -> dict:
    """What the EPP takes from one scrape: the three gauges and the LoRA info, as its Go code reads them."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    read: dict = {}
    for name in PROTOCOL_GAUGES:
        family = families[name]
        assert family.type == "gauge" and len(family.samples) == 1, (name, family.type, family.samples)
        read[name] = family.samples[0].value  # no sample carries a timestamp: the EPP takes the first
    info = families[LORA_INFO]
    assert info.type == "gauge", info.type
    listed = [s for s in info.samples if s.labels.get("running_lora_adapters") or s.labels.get("waiting_lora_adapters")]
    latest = max(listed, key=lambda s: s.value, default=None)
    if latest is not None:
        read["running"] = set(filter(None, latest.labels["running_lora_adapters"].split(",")))
        read["waiting"] = set(filter(None, latest.labels["waiting_lora_adapters"].split(",")))
        read["max_lora"] = int(latest.labels["max_lora"])
        read["changed_s"] = latest.value
    return read


def flotilla_gauges(text: str) -> dict[str, float]:
    """Flotilla's own gauges of the same scrape, by name."""
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text)
            if f.name in PROTOCOL_GAUGES.values()}


def test_health_answers_200_with_no_body_as_vllm_does(server):
    r = httpx.get(f"{server.base_url}/health", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert httpx.get(f"{server.base_url}/healthz", timeout=10).status_code == 200  # the probes' route stays


def test_under_load_the_epp_reads_flotilla_s_own_values(server):
    bodies = [{"model": model, "prompt": f"load {i}", "max_tokens": 160, "ignore_eos": True}
              for i, model in enumerate([ADAPTER, ADAPTER, "tiny", "tiny"])]  # the adapter's first: they run first
    codes: list[int] = []

    def send(body: dict) -> None:
        codes.append(httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for t in threads:
        t.start()
        time.sleep(0.05)  # in order: the adapter's requests take the slots
    scrapes, saturated = 0, None
    while any(t.is_alive() for t in threads):
        text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        read, own = epp_read(text), flotilla_gauges(text)
        for protocol, flotilla in PROTOCOL_GAUGES.items():
            assert read[protocol] == own[flotilla], (protocol, read[protocol], flotilla, own[flotilla])
        scrapes += 1
        if saturated is None and read[names.VLLM_REQUESTS_RUNNING] == SLOTS and read[names.VLLM_REQUESTS_WAITING] >= 1:
            saturated = read
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert codes == [200] * len(bodies)
    assert saturated is not None, f"no scrape of {scrapes} saw {SLOTS} running and some waiting"
    assert 0 < saturated[names.VLLM_KV_CACHE_USAGE] <= 1
    assert ADAPTER in saturated["running"] | saturated["waiting"]
    load = httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=10).json()
    assert saturated["max_lora"] == load["max_loras"] == MAX_LORAS  # the slots, as Flotilla's load report says
    assert time.time() - 600 < saturated["changed_s"] <= time.time()
    idle = epp_read(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
    assert idle[names.VLLM_REQUESTS_RUNNING] == idle[names.VLLM_REQUESTS_WAITING] == 0


def test_a_multi_model_server_answers_health_too(tmp_path):
    with run_server(tmp_path=tmp_path, model_args=("--model", "demo=tiny")) as pool:
        r = httpx.get(f"{pool.base_url}/health", timeout=10)
        assert r.status_code == 200 and r.content == b""
