"""Run kopf with Flotilla's handlers and settings; serve the operator's /metrics beside it."""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

import kopf
import prometheus_client

from flotilla_operator import credentials, handlers
from flotilla_operator.settings import OperatorSettings


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        """The same loaders as our own client (credentials.py); kopf calls this again after a 401."""
        return credentials.connection_info(credentials.login())

    handlers.register_all(registry, settings)
    return registry


def peering_priority(settings: OperatorSettings) -> int:
    """The given priority, else a random one: equal priorities make kopf pause every replica."""
    return settings.priority if settings.priority is not None else random.SystemRandom().randint(1, 2**31 - 1)


def run_operator(settings: OperatorSettings, stop_flag: threading.Event | None = None) -> None:
    """Block until the operator stops (SIGTERM/SIGINT, or `stop_flag` when given)."""
    if settings.metrics_port:
        prometheus_client.start_http_server(settings.metrics_port)
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.peering.lifetime = settings.peering_lifetime_s
    priority = peering_priority(settings)
    if settings.peering:
        logging.getLogger(__name__).info(f"peering {settings.peering!r} with priority {priority}")
    kopf.run(
        settings=kopf_settings,
        priority=priority,
        registry=build_registry(settings),
        standalone=settings.standalone,
        peering_name=settings.peering,
        clusterwide=settings.all_namespaces,
        namespaces=list(settings.namespaces),
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
        memo=kopf.Memo(settings=settings),
        stop_flag=stop_flag,
    )
