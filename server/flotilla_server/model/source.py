"""What a model SOURCE names, read without its weights: `tiny`, a Hugging Face directory or a `.gguf` file.

Why one place: a single-model server loads a source (loader.py), and a multi-model server must size each
of its models before loading it and refuse, before serving, a source it could never load
(model_cache/engine_processes.py). Both must accept exactly the same sources, with the same errors, or a
source that serves alone fails in a pool (a GGUF once did: its size was looked for in a `config.json`).
Torch-free: the multi-model server's HTTP process reads every source it lists.

Rules:
- `tiny` is the embedded demonstration model; a name ending in `.gguf` is a GGUF file (gguf_meta.py reads
  all of it but the weights: the format, architecture, tensor types, config and tokenizer); anything else is
  a directory holding `config.json`;
- every failure is a ValueError (a missing path included) whose message says what to pass instead.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .config import INT8_K_MULTIPLE, ModelConfig
from .gguf_file import GGUFFile
from .gguf_meta import is_gguf, read_gguf

TINY_NAME = "tiny"


def neither_message(source: str) -> str:
    return (f"model {source!r} is neither 'tiny', a directory nor a .gguf file: pass --model tiny, the path "
            "of a Hugging Face model directory (config.json, *.safetensors, tokenizer.json) or of a .gguf file")


@dataclass(frozen=True)
class HeldTensor:
    """One GGUF tensor as the footprint sees it: its type, its weights and its bytes in the file."""

    type_id: int
    numel: int
    nbytes: int


def gguf_tensors(source: str) -> dict[str, HeldTensor]:
    """A GGUF file's tensors by name, from its index (no weights read)."""
    return {t.name: HeldTensor(t.type_id, math.prod(t.shape), t.data.nbytes) for t in GGUFFile(Path(source)).tensors}


def resolve_quantization(source: str, requested: str | None) -> str:
    """How `source`'s weights are held (flags.QUANTIZATIONS): `requested`, or by default `gguf` for a .gguf
    file and `none` otherwise; ValueError for a combination that cannot be, saying what to pass. (`int8`
    takes any source; check_int8 checks the model's shapes and device.)"""
    if requested is None:
        return "gguf" if is_gguf(source) else "none"
    if requested == "gguf" and not is_gguf(source):
        raise ValueError(f"quantization gguf keeps a .gguf file's blocks, and {source!r} is not a .gguf file: "
                         "leave --quantization unset or pass none")
    return requested


def int8_layers(c: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of every weight `--quantization int8` holds as int8: the embedding
    (whose rows a tied head multiplies), each layer's fused projections and an untied head."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layers = [("model.embed_tokens", c.vocab_size, c.hidden_size)]
    for i in range(c.num_layers):
        layers += [(f"model.layers.{i}.self_attn.qkv_proj", q + 2 * kv, c.hidden_size),
                   (f"model.layers.{i}.self_attn.o_proj", c.hidden_size, q),
                   (f"model.layers.{i}.mlp.gate_up_proj", 2 * c.intermediate_size, c.hidden_size),
                   (f"model.layers.{i}.mlp.down_proj", c.hidden_size, c.intermediate_size)]
    if not c.tie_word_embeddings:
        layers.append(("lm_head", c.vocab_size, c.hidden_size))
    return layers


def check_not_moe(c: ModelConfig, quantization: str) -> None:
    """ValueError where `quantization` (int8 or fp8, which requantize projections one matrix at a time) would
    meet a mixture-of-experts model: its experts are stacked 3-D weights those modes do not quantize."""
    if c.moe is not None:
        raise ValueError(f"quantization {quantization} does not quantize the experts of a mixture-of-experts model "
                         f"({c.model_type}: {c.moe.num_experts} experts a sparse layer): pass --quantization none, or "
                         "gguf with a .gguf file, which keeps expert blocks")


def check_int8(c: ModelConfig, device: str) -> None:
    """ValueError, before any weight is read, where `--quantization int8` cannot serve the model: a mixture of
    experts, on a device other than the CPU, or with a layer whose in_features the int8 kernels cannot take (the
    first one named)."""
    check_not_moe(c, "int8")
    if device != "cpu":
        raise ValueError(f"quantization int8 runs on CPU here, not on {device}: pass --device cpu, or "
                         "--quantization none")
    for name, n, k in int8_layers(c):
        if k % INT8_K_MULTIPLE:
            raise ValueError(f"quantization int8 cannot take layer {name} of shape [{n}, {k}] ([out, in]): its "
                             f"kernels need in_features a multiple of {INT8_K_MULTIPLE}; pass --quantization none")


FP8_SHAPE_MULTIPLE = 16  # torch._scaled_mm's rule for both sizes of an fp8 operand (model/fp8_weights.py)
FP8_DEVICES = "compute capability 8.9 or later: L4, L40S, H100, H200"


def check_fp8(c: ModelConfig, device: str) -> None:
    """ValueError, before any weight is read, where `--quantization fp8` cannot serve the model: a mixture of
    experts, on CPU, or with a projection whose sizes `_scaled_mm` cannot take (the first one named). The GPU's
    own fp8 support is checked at load (loader.py), where torch can ask it."""
    check_not_moe(c, "fp8")
    if not device.startswith("cuda"):
        raise ValueError(f"quantization fp8 runs on a GPU with fp8 tensor cores ({FP8_DEVICES}), not on "
                         f"{device}: on CPU pass --quantization int8 (any model) or gguf (a .gguf file)")
    for name, n, k in int8_layers(c):
        if name in ("model.embed_tokens", "lm_head"):
            continue  # they stay in --dtype
        if n % FP8_SHAPE_MULTIPLE or k % FP8_SHAPE_MULTIPLE:
            raise ValueError(f"quantization fp8 cannot take layer {name} of shape [{n}, {k}] ([out, in]): fp8 "
                             f"products need both sizes a multiple of {FP8_SHAPE_MULTIPLE}; pass --quantization none")


def hf_config(path: Path) -> ModelConfig:
    """A Hugging Face directory's config; FileNotFoundError or ValueError (UnsupportedModelError) saying what
    to change."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found: a Hugging Face model directory needs config.json")
    with config_file.open() as f:
        return ModelConfig.from_hf(json.load(f))


def source_config(source: str) -> ModelConfig:
    """The config of the model `source` names, after every check that needs no weights; ValueError saying
    what to pass instead."""
    if source == TINY_NAME:
        from .tiny import TINY_CONFIG  # torch: only where tiny is served

        return TINY_CONFIG
    path = Path(source)
    try:
        if is_gguf(source):
            return read_gguf(path)[1]
        if not path.is_dir():
            raise FileNotFoundError(neither_message(source))
        return hf_config(path)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    except OSError as e:  # unreadable: permissions, a broken mount
        raise ValueError(f"cannot read {source}: {e.strerror or e}; check the path and its permissions") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / 'config.json'} is not JSON ({e}); restore the model's config.json") from None
    except (KeyError, TypeError, IndexError, struct.error) as e:  # a GGUF cut short, or missing a field
        raise ValueError(f"{source} is not a GGUF file Flotilla can read ({type(e).__name__}: {e}); "
                         "download the file again or pass another") from None
