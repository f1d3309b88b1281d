"""transformers as the reference for GGUF files: its own dequantization, Q/K un-permutation and
config mapping (`load_gguf_checkpoint`), none of which Flotilla's loader shares.

`from_pretrained(gguf_file=...)` would need `accelerate`; it does the same three steps as below.
The file is parsed once: a model built on the meta device from any config of the same depth only
supplies parameter names for the tensor mapping, then the real model is built from transformers' own
config mapping. Two shortcuts keep this under 20 s on 2 cores without changing the result: the
tensor-name map (a pure function of architecture and depth, rebuilt per module by transformers) is
memoised, and the model skips random initialisation (every weight is then loaded).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]


def smollm2_gguf() -> Path:
    """The cached SmolLM2 GGUF: downloaded at most once (by `make model`), offline after that."""
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_smollm2.py")],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


@dataclass
class Reference:
    model: Any  # a transformers *ForCausalLM
    parsed: dict[str, Any]  # load_gguf_checkpoint's config, tokenizer and tokenizer_config


# the tokenizer arrays a model reference never reads (without_vocabulary)
_VOCABULARY_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                      "tokenizer.ggml.merges")


def without_vocabulary(path: Path, out: Path) -> Path:
    """A copy of the GGUF at `path` with the same metadata and tensor bytes but no vocabulary arrays, and
    `{arch}.vocab_size` saying their length: transformers' GGUF reader parses a vocabulary element by element
    (20 s of CPU for Gemma 3's 262,144 tokens), and its model never reads it. Tensors keep their types and
    bytes, so the reference dequantizes them itself, as from the original file."""
    from flotilla_server.model.gguf_file import GGUFModel
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    gg = GGUFModel(path)
    w = GGUFWriter(str(out), gg.architecture)
    for key, value in gg.file.fields.items():
        if key in _VOCABULARY_ARRAYS or key.startswith("GGUF.") or key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    w.add_key_value(f"{gg.architecture}.vocab_size", len(gg.field("tokenizer.ggml.tokens")), GGUFValueType.UINT32)
    for t in gg.tensors:
        kind = GGMLQuantizationType(t.type_id)
        data = t.data.view(np.float32) if kind == GGMLQuantizationType.F32 else t.data
        w.add_tensor(t.name, data, raw_dtype=None if kind == GGMLQuantizationType.F32 else kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def tokenizer_parameters(path: Path) -> dict[str, Any]:
    """What transformers' GGUF reader hands its tokenizer conversion (load_gguf_checkpoint's `tokenizer`): the
    file's `tokenizer.*` fields renamed by its own mapping, read here by Flotilla's reader, which takes 1 s
    where transformers' takes 20 for a 262,144-token vocabulary (the values are the same: strings, numbers)."""
    from flotilla_server.model.gguf_file import GGUFModel
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    renames = GGUF_TO_TRANSFORMERS_MAPPING["tokenizer"]["tokenizer"]
    fields = GGUFModel(path).file.fields
    return {renames[key.removeprefix("tokenizer.")]: (list(value) if isinstance(value, (list, tuple)) else value)
            for key, value in fields.items()
            if key.startswith("tokenizer.") and renames.get(key.removeprefix("tokenizer.")) not in (None, -1)}


def load_reference(path: Path, num_layers: int, arch: str = "llama", **config: Any) -> Reference:
    """transformers' model of the file, for any architecture `arch` its GGUF loader maps (llama, qwen2, ...);
    `config`: values its config mapping misses (qwen3_moe's moe_intermediate_size, from no GGUF key)."""
    import gguf
    import transformers
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config_class = transformers.AutoConfig.for_model(arch).__class__
    model_class = transformers.AutoModelForCausalLM._model_mapping[config_class]
    with torch.device("meta"):
        names_only = model_class(config_class(num_hidden_layers=num_layers, hidden_size=64, intermediate_size=64,
                                              num_attention_heads=1, num_key_value_heads=1, vocab_size=8,
                                              head_dim=64, pad_token_id=None))  # Phi3Config's default: 32000
    name_map = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=names_only)
    finally:
        gguf.get_tensor_name_map = name_map
    config = {**parsed["config"], **config}
    config.pop("model_type", None)
    with no_init_weights():
        model = model_class(config_class(**config))
    missing = model.load_state_dict(parsed.pop("tensors"), strict=False).missing_keys
    assert missing in ([], ["lm_head.weight"]), missing  # a tied head is missing, nothing else
    model.tie_weights()
    return Reference(model.to(torch.float32).eval(), parsed)


def is_reference_greedy(model: Any, prompt: list[int], answer: list[int]) -> bool:
    """Whether `answer` is transformers' greedy continuation of `prompt`: one forward pass over
    prompt + answer (teacher forcing), the argmax after every position equal to the next answer
    token. It is the same test as comparing with `generate(do_sample=False)`, at the cost of one
    prefill instead of one step per token."""
    ids = torch.tensor([prompt + answer])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server process holds the other core; 2 threads here ran 3-5x slower
    try:
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1]
    finally:
        torch.set_num_threads(threads)
    return logits.argmax(-1).tolist() == answer
