"""PEFT LoRA adapters made for tests: random factors with a fixed seed, saved as peft saves them.

    adapter = make_lora_adapter(base_dir, tmp_path / "a", rank=8, seed=1)   # a PEFT directory
    reference = peft_model(base_dir, adapter)                              # peft on transformers, unmerged

`init_lora_weights=False` makes both factors random: peft's default makes B zero, and the adapter would then
change nothing. `scale` multiplies B after peft has made it, so that the adapter moves a random test model's
greedy tokens (peft's random B is small beside the test models' weights).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_lora_adapter(base_dir: Path, path: Path, rank: int = 8, seed: int = 0, alpha: float | None = None,
                      targets: tuple[str, ...] = ALL_TARGETS, scale: float = 4.0, **config: Any) -> Path:
    """Saves a peft LoRA adapter of `base_dir`'s model at `path`; `config` goes to peft.LoraConfig."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = copy.deepcopy(_base_model(str(base_dir)))  # get_peft_model wraps the base's modules in place
    lora = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, target_modules=list(targets),
                      init_lora_weights=False, **config)
    model = get_peft_model(base, lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    model.save_pretrained(path)
    return path


@functools.lru_cache(maxsize=4)
def _base_model(base_dir: str):
    """The base as transformers loads it, once per directory (loading it is most of an adapter's making)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(base_dir)


def edit_adapter_config(path: Path, **changes: Any) -> Path:
    """Rewrites fields of `path`'s adapter_config.json (bad-input tests)."""
    file = path / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))
    return path


def peft_model(base_dir: Path, adapter: Path):
    """peft's model: the adapter applied to the base on transformers, unmerged, in eval mode."""
    import transformers
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    return PeftModel.from_pretrained(base, adapter).eval()
