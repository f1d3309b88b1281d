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
