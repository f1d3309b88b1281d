"""kopf wiring of adaptive tiering: a timer per InferenceModel of `placement.policy: adaptive`.

Every `--autoscale-interval-s` it calls tier_mover.tier_once: a move in flight takes its next step, and a model
at rest is decided on (tiering.decide_tier). Models of other policies return at once, without an API call.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from flotilla_operator import types
from flotilla_operator.kube import KubeError
from flotilla_operator.placement import ADAPTIVE
from flotilla_operator.prometheus import PrometheusClient
from flotilla_operator.reconciler import Context
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.tier_mover import tier_once


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    resource = (types.GROUP, types.VERSION, types.PLURAL)

    @kopf.timer(*resource, id="tiering", interval=settings.autoscale_interval_s,
                initial_delay=settings.autoscale_interval_s, registry=registry)
    async def tier(spec: kopf.Spec, name: str, namespace: str, memo: kopf.Memo, logger: logging.Logger,
                   **_: Any) -> None:
        if (spec.get("placement") or {}).get("policy") != ADAPTIVE:
            return
        ctx: Context | None = getattr(memo, "ctx", None)
        prometheus: PrometheusClient | None = getattr(memo, "prometheus", None)  # the autoscaler's client
        if ctx is None or prometheus is None:
            return
        try:
            await tier_once(ctx, prometheus, namespace, name, logger)
        except KubeError as error:  # the next tick starts again from what status recorded
            logger.warning(f"tiering: {namespace}/{name}: {error}")
