"""bfloat16 against transformers in bfloat16: the paged runtime is as close to float32 as transformers is.

Greedy tokens are no test in bfloat16: two correct implementations round differently (kernels, summation
order), and a random model's top two logits often lie within one rounding step, so a token may flip. What
both must share is the error: each position's logits, computed by a bfloat16 prefill and then by one-row
bfloat16 decode steps (the packed oneDNN path on CPU, model/linear.py), are compared with transformers'
float32 logits for the same tokens, and the runtime's largest error may be at most twice transformers'
bfloat16 error. A wrong kernel, a layout mix-up or a float32 step skipped is off by the logits' own scale,
orders of magnitude above that bound.
"""

from __future__ import annotations

import pytest
import torch
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors, load_model

from tests.support.hf_models import random_prompts

from .conftest import DEVICE

PROMPT_TOKENS = 40
DECODE_TOKENS = 12
BLOCK_SIZE = 16


def _hf_logits(path, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(DEVICE).eval()
    with torch.inference_mode():
        return model(torch.tensor([tokens], device=DEVICE)).logits[0].float()


def _paged_logits(model: DecoderModel, tokens: list[int], prefill: int) -> torch.Tensor:
    """Logits at positions prefill-1 .. len-2: one prefill step of `prefill` tokens, then one decode
    step per further token (teacher-forced), as the engine runs them."""
    cfg, w = model.config, model.embed_tokens.weight
    blocks = -(-len(tokens) // BLOCK_SIZE)
    kv = KVCacheTensors.allocate(cfg.num_layers, blocks, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, w.dtype,
                                 w.device)
    table = list(range(blocks))
    out = []
    done = 0
    for n in [prefill] + [1] * (len(tokens) - prefill - 1):
        batch = AttentionBatch.build([n], [done + n], [table], BLOCK_SIZE, w.device)
        with torch.inference_mode():
            hidden = model(torch.tensor(tokens[done:done + n], device=w.device),
                           torch.arange(done, done + n, device=w.device), batch, kv)
            out.append(model.compute_logits(hidden[-1:]))
        done += n
    return torch.cat(out)


@pytest.mark.parametrize("variant", ["llama-gqa", "llama-tied-mha", "qwen3-qknorm-sharded", "phi3-partial-tied-window",
                                     "phi3-longrope"])
def test_bfloat16_runtime_is_as_close_to_float32_as_transformers(hf_model_dir, variant):
    path = hf_model_dir(variant)
    tokens = random_prompts([PROMPT_TOKENS + DECODE_TOKENS], seed=5)[0]
    positions = slice(PROMPT_TOKENS - 1, len(tokens) - 1)
    reference = _hf_logits(path, tokens, torch.float32)[positions]
    hf_error = (_hf_logits(path, tokens, torch.bfloat16)[positions] - reference).abs().max().item()

    model = load_model(str(path), "bfloat16", DEVICE).model
    ours = _paged_logits(model, tokens, PROMPT_TOKENS)
    ours_error = (ours - reference).abs().max().item()

    scale = reference.abs().max().item()
    assert 0 < hf_error < 0.2 * scale, f"degenerate reference: transformers' bfloat16 error {hf_error} of {scale}"
    assert ours_error <= 2 * hf_error, (
        f"bfloat16 runtime error {ours_error:.4g} against transformers' bfloat16 {hf_error:.4g} (logits up to {scale:.3g})"
    )
