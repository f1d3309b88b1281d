"""The model runtime: Llama-family decoders over a paged KV pool, their tokenizer, and the loader."""

from .attention import AttentionBatch
from .config import ModelConfig, UnsupportedModelError
from .kv_tensors import KVCacheTensors
from .llama import DecoderModel
from .loader import LoadedModel, load_model
from .tokenizer import Tokenizer

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
