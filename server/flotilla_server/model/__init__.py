"""The model runtime: Llama-family decoders over a paged KV pool, their tokenizer, and the loader.

The names below load on first use (PEP 562), so that importing a torch-free module of this package
(`model.tokenizer`, `model.config`) from the HTTP layer does not load torch (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "AttentionBatch": ".attention",
    "DecoderModel": ".llama",
    "KVCacheTensors": ".kv_tensors",
    "LoadedModel": ".loader",
    "ModelConfig": ".config",
    "Tokenizer": ".tokenizer",
    "UnsupportedModelError": ".config",
    "load_model": ".loader",
}

__all__ = [
    "AttentionBatch",
    "DecoderModel",
    "KVCacheTensors",
    "LoadedModel",
    "ModelConfig",
    "Tokenizer",
    "UnsupportedModelError",
    "load_model",
]
assert sorted(__all__) == sorted(_WHERE)

if TYPE_CHECKING:
    from .attention import AttentionBatch
    from .config import ModelConfig, UnsupportedModelError
    from .kv_tensors import KVCacheTensors
    from .llama import DecoderModel
    from .loader import LoadedModel, load_model
    from .tokenizer import Tokenizer


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
