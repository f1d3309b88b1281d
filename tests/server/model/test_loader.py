"""load_model: HF directories (sharded or not), the tiny demonstration model, dtypes, clear errors."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest
import torch
from flotilla_server.model import load_model
from flotilla_server.model.config import UnsupportedModelError
from flotilla_server.model.tiny import build_tiny_model, build_tiny_tokenizer

from tests.support.hf_models import random_prompts

from .conftest import DEVICE
from .paged import paged_greedy


def test_sharded_checkpoint_loads(hf_model_dir):
    path = hf_model_dir("qwen3-qknorm-sharded")
    assert len(list(path.glob("*.safetensors"))) > 1 and (path / "model.safetensors.index.json").is_file()
    loaded = load_model(str(path), "float32", "cpu")
    assert loaded.config.model_type == "qwen3" and loaded.name == path.name


def test_tiny_is_deterministic_fast_and_labelled(caplog):
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        a = load_model("tiny", "float32", "cpu")
    assert time.perf_counter() - started < 2.0  # generous: builds in ~0.3 s on an idle core
    assert "DEMONSTRATION" in caplog.text and "DEMONSTRATION" in a.description and a.is_demonstration
    b = build_tiny_model()
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    text = "Flotilla scales fleets."
    assert a.tokenizer.encode(text) == build_tiny_tokenizer().encode(text)
    assert a.tokenizer.decode(a.tokenizer.encode(text)) == text
    assert a.config.vocab_size == a.tokenizer.vocab_size
    assert {a.tokenizer.token_to_id("</s>"), a.tokenizer.token_to_id("<|im_end|>")} <= a.tokenizer.eos_token_ids
    assert a.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_stays_close_to_float32(hf_model_dir, dtype):
    path = hf_model_dir("llama-gqa")
    prompts = random_prompts([30, 12], seed=9)
    half = load_model(str(path), dtype, DEVICE).model
    assert half.embed_tokens.weight.dtype == getattr(torch, dtype)
    out = paged_greedy(half, prompts, 6, chunk=8, start_steps=[0, 1])
    assert all(len(o) == 6 for o in out)
    full = paged_greedy(load_model(str(path), "float32", DEVICE).model, prompts, 6, chunk=8, start_steps=[0, 1])
    assert out[0][0] == full[0][0] and out[1][0] == full[1][0]  # first tokens agree; later ones may drift


def test_tiny_generates_in_bfloat16():
    model = load_model("tiny", "bfloat16", DEVICE).model
    assert all(len(o) == 4 for o in paged_greedy(model, [[1, 2, 3], list(range(40))], 4, chunk=16))


def test_missing_model_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"neither 'tiny', a directory nor a \.gguf file"):
        load_model(str(tmp_path / "nope"), "float32", "cpu")
    with pytest.raises(FileNotFoundError, match=r"needs config\.json"):
        load_model(str(tmp_path), "float32", "cpu")
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model("tiny", "float64", "cpu")


def _copy_model(hf_model_dir, variant, dst):
    shutil.copytree(hf_model_dir(variant), dst)
    return dst


def test_missing_shard_or_weight_is_named(hf_model_dir, tmp_path):
    path = _copy_model(hf_model_dir, "qwen3-qknorm-sharded", tmp_path / "m")
    next(iter(sorted(path.glob("*.safetensors")))).unlink()
    with pytest.raises(FileNotFoundError, match=r"is listed in model\.safetensors\.index\.json but missing"):
        load_model(str(path), "float32", "cpu")


def test_checkpoint_that_does_not_match_config_is_refused(hf_model_dir, tmp_path):
    path = _copy_model(hf_model_dir, "llama-gqa", tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 96
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json implies"):
        load_model(str(path), "float32", "cpu")
    config["intermediate_size"], config["num_hidden_layers"] = 128, 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing weights"):
        load_model(str(path), "float32", "cpu")


def test_unsupported_architecture_is_refused(hf_model_dir, tmp_path):
    path = _copy_model(hf_model_dir, "llama-gqa", tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "gemma"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="model_type 'gemma' is not supported"):
        load_model(str(path), "float32", "cpu")


def test_no_weights_is_refused(hf_model_dir, tmp_path):
    path = _copy_model(hf_model_dir, "llama-gqa", tmp_path / "m")
    for f in path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load_model(str(path), "float32", "cpu")


def test_other_safetensors_beside_model_safetensors_are_ignored(hf_model_dir, tmp_path):
    from safetensors.torch import save_file

    path = _copy_model(hf_model_dir, "llama-gqa", tmp_path / "m")
    assert (path / "model.safetensors").is_file()
    save_file({"tok_embeddings.weight": torch.zeros(2, 2)}, str(path / "consolidated.safetensors"))
    assert load_model(str(path), "float32", "cpu").config.model_type == "llama"


@pytest.mark.parametrize("template_file", ["tokenizer_config.json", "chat_template.jinja"])
def test_chat_template_loads_from_either_file_like_transformers(hf_model_dir, tmp_path, template_file):
    """Newer Hugging Face repositories keep the template in chat_template.jinja, older ones in
    tokenizer_config.json; both load and render as transformers renders them."""
    import transformers

    path = tmp_path / "model"
    shutil.copytree(hf_model_dir("llama-gqa"), path)
    if template_file == "chat_template.jinja":
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "chat_template.jinja").write_text(config.pop("chat_template"))
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "Hello"}]
    rendered = load_model(str(path), "float32", "cpu").tokenizer.apply_chat_template(messages)
    expected = transformers.AutoTokenizer.from_pretrained(path).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert rendered == expected and "Hello" in rendered
