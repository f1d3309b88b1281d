"""Build an engine client over its backend: the engine in its own process (the default) or on a thread.

The one place that chooses a backend, so that engine/client.py (imported by the HTTP layer) never imports
the engine's torch side (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import Any

from flotilla_server.engine.backends import ConnectedBackend, ParkedEngine, ProcessBackend, ThreadBackend
from flotilla_server.engine.client import DEFAULT_STREAM_BUFFER_EVENTS, ENGINE_MODES, EngineClient, EngineMode
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineInfo, EngineOptions


def make_engine(config: EngineConfig, mode: EngineMode = "process", options: EngineOptions | None = None, *,
                loaded: Any = None, stream_buffer_events: int = DEFAULT_STREAM_BUFFER_EVENTS,
                start_method: str = "spawn") -> EngineClient:
    """A client not yet started. `loaded` (a LoadedModel, inprocess only) reuses a model in memory (tests).
    `start_method` (process mode): "spawn", or "forkserver" to fork from a process that imported torch once
    (backends.start_forkserver; a multi-model server's loads)."""
    if mode not in ENGINE_MODES:
        raise ValueError(f"--engine-mode must be one of {', '.join(ENGINE_MODES)}, got {mode!r}")
    options = options or EngineOptions()
    if mode == "process":
        if loaded is not None:
            raise ValueError("a model already in memory can only be reused in the inprocess mode")
        backend: Any = ProcessBackend(config, options, start_method=start_method)
    else:
        backend = ThreadBackend(config, options, loaded)
    return EngineClient(backend, stream_buffer_events=stream_buffer_events)


def make_parkable_engine(config: EngineConfig, options: EngineOptions, *, woken: ParkedEngine | None = None,
                         stream_buffer_events: int = DEFAULT_STREAM_BUFFER_EVENTS) -> tuple[EngineClient, ProcessBackend]:
    """A pool's engine, not yet started, forked from the forkserver: warmed up before it says ready, and
    parkable through the returned backend (ProcessBackend.park). With `woken`, its start wakes that parked
    engine instead of forking a new one."""
    backend = ProcessBackend(config, options, start_method="forkserver", parkable=True, woken=woken)
    return EngineClient(backend, stream_buffer_events=stream_buffer_events), backend


def build_engine(config: EngineConfig, mode: EngineMode = "process",
                 options: EngineOptions | None = None) -> tuple[EngineClient, EngineInfo]:
    """Returns (the started engine client, what the engine serves); raises EngineStartError."""
    client = make_engine(config, mode, options)
    return client, client.start()


def connect_engine(conn: Any, info: EngineInfo, stream_buffer_events: int = DEFAULT_STREAM_BUFFER_EVENTS) -> EngineClient:
    """A client, not yet started, over one pipe of an engine process another process started with several
    (engine/backends.py spawn_engine; flotilla_server/fronts.py)."""
    return EngineClient(ConnectedBackend(conn, info), stream_buffer_events=stream_buffer_events)
