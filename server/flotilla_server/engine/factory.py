"""Build the engine the server runs: load the model once, wrap the synchronous core in its thread."""

from __future__ import annotations

from flotilla_server.engine.client import EngineClient
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.model import LoadedModel


def build_engine(config: EngineConfig) -> tuple[EngineClient, LoadedModel, int]:
    """Returns (the started engine client, the loaded model, the context limit in tokens)."""
    core = EngineCore(config)
    client = EngineClient(core)
    client.start()
    return client, core.loaded, core.max_model_len
