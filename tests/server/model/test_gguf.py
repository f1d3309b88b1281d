"""GGUF loading on small files written in the test: every supported tensor type against transformers,
refusals that name what is not supported, the served name, the tokenizer from metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from flotilla_server.model import UnsupportedModelError, load_model
from flotilla_server.model.gguf_loader import SUPPORTED_TYPES, served_name

from tests.support.hf_models import random_prompts

from .gguf_files import LAYERS, SPECIAL, T, write_llama_gguf
from .gguf_reference import is_reference_greedy, load_reference
from .paged import paged_greedy

NEW_TOKENS = 6


@pytest.mark.parametrize("tensor_type", sorted(SUPPORTED_TYPES, key=lambda t: t.name), ids=lambda t: t.name)
def test_every_supported_type_equals_transformers(tmp_path, tensor_type):
    """Greedy tokens (a batch, prefill in chunks of 5) equal transformers on the same file: its own
    config mapping, dequantization and un-permutation of Q and K (4 query heads, 2 KV heads)."""
    path = write_llama_gguf(tmp_path / f"m-{tensor_type.name}.gguf", tensor_type)
    loaded = load_model(str(path), "float32", "cpu")
    reference = load_reference(path, num_layers=LAYERS)
    prompts = random_prompts([9, 14, 3], seed=7, vocab=loaded.config.vocab_size)
    got = paged_greedy(loaded.model, prompts, NEW_TOKENS, chunk=5, start_steps=[0, 1, 2])
    for prompt, answer in zip(prompts, got, strict=True):
        assert is_reference_greedy(reference.model, prompt, answer)
    assert len({t for a in got for t in a}) > 1, "degenerate output: the comparison would be weak"
    assert loaded.config.tie_word_embeddings is False


def test_unsupported_tensor_type_is_named(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", T.IQ4_XS)
    with pytest.raises(UnsupportedModelError, match=r"type IQ4_XS, which Flotilla does not dequantize; supported: .*Q5_K"):
        load_model(str(path))


def test_unsupported_architecture_is_named(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'gpt2' is not supported"):
        load_model(str(path))


def test_unknown_pre_tokenizer_is_named_not_guessed(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", pre="made-up-pre")
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'made-up-pre' is not known"):
        load_model(str(path))


def test_unknown_tokenizer_model_is_named(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", tokenizer_model="t5")
    with pytest.raises(UnsupportedModelError, match=r"tokenizer model 't5' is not supported: .*\('gpt2'\) and .*\('llama'\)"):
        load_model(str(path))


def test_rope_scaling_is_refused(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", **{"llama.rope.scaling.type": "yarn"})
    with pytest.raises(UnsupportedModelError, match="RoPE scaling type 'yarn' is not supported"):
        load_model(str(path))


def test_missing_file_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pass --model with the path of a \.gguf file"):
        load_model(str(tmp_path / "absent.gguf"))


@pytest.mark.parametrize(("file", "name"), [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "llama-3.2-1b-instruct"),
    ("model-f16.gguf", "model"),
    ("tinyllama.gguf", "tinyllama"),
])
def test_served_name_drops_the_quantization(file, name):
    assert served_name(Path(file)) == name


def test_tokenizer_and_template_come_from_the_metadata(tmp_path):
    loaded = load_model(str(write_llama_gguf(tmp_path / "Chat.Q8_0.gguf", T.Q8_0)))
    tok = loaded.tokenizer
    assert loaded.name == "chat"
    text = tok.apply_chat_template([{"role": "user", "content": "in the heat"}])
    assert text == "<|im_start|>user\nin the heat<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == SPECIAL.index("<|im_start|>") and tok.decode(ids, skip_special_tokens=False) == text
    assert tok.token_to_id("Ġthe") in ids  # merges applied
    assert tok.encode("12", add_special_tokens=False) == [tok.token_to_id("1"), tok.token_to_id("2")]
    assert tok.eos_token_ids == {SPECIAL.index("<|im_end|>")}


@pytest.mark.parametrize("cut", ["tail", "shape"])
def test_a_file_shorter_than_its_tensors_is_refused_before_any_kernel_reads_it(tmp_path, cut):
    path = write_llama_gguf(tmp_path / "m.gguf", T.Q4_1)
    data = path.read_bytes()
    if cut == "tail":  # a download cut short
        path.write_bytes(data[:-1000])
    else:  # a tensor whose shape says more rows than its data holds: the last one, made 4 rows longer
        from flotilla_server.model.gguf_file import GGUFFile

        last = GGUFFile(path).tensors[-1]
        dims = b"".join(n.to_bytes(8, "little") for n in reversed(last.shape))
        grown = b"".join(n.to_bytes(8, "little") for n in reversed((last.shape[0] + 4, *last.shape[1:])))
        assert data.count(dims) >= 1
        at = data.rindex(last.name.encode()) + len(last.name) + 4  # after the name and the dimension count
        path.write_bytes(data[:at] + data[at:].replace(dims, grown, 1))
    with pytest.raises(ValueError, match=r"ends at byte \d+, but the file has \d+: the file is cut short"):
        load_model(str(path))


def test_quantization_gguf_needs_a_gguf_file(hf_model_dir):
    with pytest.raises(ValueError, match=r"quantization gguf keeps a \.gguf file's blocks, and .* is not a \.gguf file"):
        load_model(str(hf_model_dir("llama-gqa")), quantization="gguf")
