"""What a multi-model server's forkserver imports once, so that each engine forked from it pays for its own
model only (engine/backends.py, start_forkserver).

Importing this module imports torch and the engine, then builds a two-layer toy decoder on the meta device
and gives it empty CPU memory, as the loader does: torch imports a lot lazily the first time (torch._refs,
torch.fx.experimental.symbolic_shapes: ~4 s of CPU on a 2-core box, in every new process). It also learns
the demonstration model's tokenizer merges (pure Python, cached). It runs no tensor operation: OpenMP's
threads must not exist yet when the forkserver forks.
"""

from __future__ import annotations

import torch

import flotilla_server.engine.loop
import flotilla_server.engine.process_main  # noqa: F401  (the engine's modules, for every child)
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.llama import DecoderModel
from flotilla_server.model.tiny import build_tiny_tokenizer

_TOY = ModelConfig(model_type="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=4, max_position_embeddings=8)


def _warm() -> None:
    with torch.device("meta"):
        net = DecoderModel(_TOY).to(torch.float32)
    net.to_empty(device="cpu")
    build_tiny_tokenizer()


_warm()
