"""What a base model's LoRA adapters add to its memory, known before loading it: the adapter slots and the
adapters' host copies (docs/serving.md, "LoRA adapters", multi-model mode).

Why: the memory budget and eviction charge each model its footprint (footprint.py); a base served with
adapters holds more than its weights and KV pool, and a budget that did not count it would overcommit.
Pure arithmetic and a file header, torch-free, as footprint.py; tests check it against a loaded engine's
adapter cache (LoraSlots.nbytes, LoraAdapter.nbytes(4)).

Rules (what engine/adapter_cache.py and model/lora_linear.py allocate):
- a base with adapters is started with `max_loras` slots (runtime loads on: its list may grow), each slot
  per layer and fused projection an A [parts x max_rank, in] and a B [max_rank, out], in the compute dtype,
  allocated once whatever the adapters' ranks;
- every listed adapter is held in host memory as float32 factors: 4 bytes per element of its
  adapter_model.safetensors tensors, counted from the file's header (its first 8 bytes: the JSON header's
  length, little-endian; the JSON: each tensor's shape), without reading a weight;
- a base without adapters costs nothing more: it has no slots.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from flotilla_server.model.config import ModelConfig
from flotilla_server.model_cache.footprint import DTYPE_BYTES

WEIGHTS_FILE = "adapter_model.safetensors"  # model/lora_adapter.py's
HOST_DTYPE_BYTES = 4  # adapters are held in host memory as float32 (model/lora_adapter.py LoraModule)
_MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own cap on a header


def slot_bytes(c: ModelConfig, max_loras: int, max_rank: int, dtype: str) -> int:
    """LoraSlots(c, max_loras, max_rank, dtype).nbytes(), from the config alone."""
    q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    # (parts, in, out) of the fused projections: QKV, O, gate-up, down (lora_linear.PROJECTION_PARTS)
    projections = ((3, h, q + 2 * kv), (1, q, h), (2, h, 2 * i), (1, i, h))
    per_layer = sum(parts * max_rank * in_size + max_rank * out_size for parts, in_size, out_size in projections)
    return max_loras * c.num_layers * per_layer * DTYPE_BYTES[dtype]


def adapter_host_bytes(name: str, source: str) -> int:
    """The adapter's float32 factors (LoraAdapter.nbytes(4)); ValueError naming the adapter if its weights
    file is missing or its header unreadable."""
    path = Path(source) / WEIGHTS_FILE
    try:
        with open(path, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            if not 0 < length <= _MAX_HEADER_BYTES:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(fh.read(length))
        elements = sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
    except FileNotFoundError:
        raise ValueError(f"adapter {name!r}: {path} not found: a PEFT adapter directory holds adapter_config.json "
                         f"and {WEIGHTS_FILE}") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"adapter {name!r}: {path} is not a safetensors file ({e})") from None
    return HOST_DTYPE_BYTES * elements


def adapters_bytes(c: ModelConfig, adapters: Iterable[tuple[str, str]], max_loras: int, max_rank: int,
                   dtype: str) -> int:
    """The slots and host copies of a base serving `adapters` ((name, source) pairs); 0 without adapters."""
    adapters = tuple(adapters)
    if not adapters:
        return 0
    return slot_bytes(c, max_loras, max_rank, dtype) + sum(adapter_host_bytes(n, s) for n, s in adapters)
