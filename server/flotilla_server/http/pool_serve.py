"""Serve several models from one memory budget (multi-model mode): the model cache behind the pool front,
drained on SIGTERM like a single-model server (serve.DrainingServer)."""

from __future__ import annotations

import uvicorn

from flotilla_server.engine.startup_heap import freeze_startup_heap
from flotilla_server.http.api_key import ApiKeyGuard
from flotilla_server.http.bounded_protocol import EVENT_LOOP, BoundedHttpProtocol
from flotilla_server.http.pool_front import PoolFront
from flotilla_server.http.pool_routes import create_pool_app
from flotilla_server.http.serve import DrainingServer, curl_example
from flotilla_server.http.settings import ServerSettings
from flotilla_server.model_cache.cache import ModelCache
from flotilla_server.model_cache.status import CacheHooks


def build_front(settings: ServerSettings, cache: ModelCache) -> PoolFront:
    front = PoolFront(cache, settings)
    cache.hooks = CacheHooks(evicting=front.evicting, load_seconds=front.metrics.load_seconds.observe,
                             loaded=front.metrics.observe_load,
                             engine_died=front.engine_died, adapters_changed=front.adapters_changed)
    front.routes = create_pool_app(front)
    return front


def serve_pool(settings: ServerSettings, cache: ModelCache) -> int:
    """Serve until drained; stops the load worker and every engine on the way out."""
    front = build_front(settings, cache)
    app = ApiKeyGuard(front, settings.api_key) if settings.api_key else front  # as a single-model server
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=1, access_log=False, http=BoundedHttpProtocol, loop=EVENT_LOOP,
                            lifespan="on")
    server = DrainingServer(config, front, settings.drain_timeout_s)
    names = cache.names()
    listing = cache.list_status()
    if names:
        serving = f"serving {len(names)} model(s) ({', '.join(names)})"
    else:  # only an empty list file gets here: a server whose every source failed does not start
        serving = f"serving no model until the model list {listing.path if listing else ''} names one"
    print(f"flotilla-server: {serving} within a memory budget of {cache.budget_bytes} bytes on "
          f"http://{settings.host}:{settings.port}; each loads on its first request; try:\n  "
          f"{curl_example(settings, names[0] if names else 'NAME')}", flush=True)
    freeze_startup_heap()
    try:
        server.run()
    finally:
        cache.shutdown()
    return 0
