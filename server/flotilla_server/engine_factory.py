"""Build the engine the server runs: load the model once, wrap the synchronous core in its thread.

``ServerEngine`` adds one hook to AsyncEngine: listeners told of every abort with its reason, on the
thread that aborted. A slow client is aborted by its stream while the handler is blocked sending to
that very client, so the handler cannot be the one to count it.
"""

from __future__ import annotations

from collections.abc import Callable

from flotilla_server.async_engine import AsyncEngine
from flotilla_server.config import EngineConfig
from flotilla_server.engine_core import EngineCore
from flotilla_server.model import LoadedModel

AbortListener = Callable[[str, str], None]  # (request_id, reason)


class ServerEngine(AsyncEngine):
    def __init__(self, core: EngineCore) -> None:
        super().__init__(core)
        self._abort_listeners: list[AbortListener] = []

    def add_abort_listener(self, listener: AbortListener) -> None:
        self._abort_listeners.append(listener)

    def abort(self, request_id: str, reason: str) -> None:
        for listener in self._abort_listeners:
            listener(request_id, reason)
        super().abort(request_id, reason)


def build_engine(config: EngineConfig) -> tuple[ServerEngine, LoadedModel, int]:
    """Returns (the started engine, the loaded model, the context limit in tokens)."""
    core = EngineCore(config)
    engine = ServerEngine(core)
    engine.start()
    return engine, core.loaded, core.max_model_len
