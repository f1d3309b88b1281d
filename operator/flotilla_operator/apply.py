"""The executor of plan-then-apply: observe the live children, then carry a `plan.Plan` out.

It decides nothing (plan.py does). `observe` GETs each desired child and LISTs the kinds a spec change
can make unwanted; `execute` applies every action in order. A transient API error (throttling, 5xx,
conflict, network) stops the run and propagates, so the caller retries the whole reconcile; a final
refusal (an invalid object, a forbidden kind) is collected and the other actions still run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flotilla_operator.kube import KubeClient, KubeError
from flotilla_operator.manifests import child_selector
from flotilla_operator.plan import Action, Key, Plan, key_of

PLURALS = {
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("apps/v1", "Deployment"): "deployments",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
}


def plural_of(api_version: str, kind: str) -> str:
    return PLURALS[(api_version, kind)]


async def observe(kube: KubeClient, namespace: str, owner_name: str, desired: Iterable[dict[str, Any]],
                  prunable: Iterable[tuple[str, str]]) -> dict[Key, dict[str, Any]]:
    """The live children: each desired one that exists, and every child of the `prunable` kinds."""
    found: dict[Key, dict[str, Any]] = {}
    for child in desired:
        api_version, kind, name = key_of(child)
        live = await kube.get(api_version, plural_of(api_version, kind), namespace, name)
        if live is not None:
            found[key_of(child)] = {"apiVersion": api_version, "kind": kind, **live}
    for api_version, kind in prunable:
        try:
            items = await kube.list(api_version, plural_of(api_version, kind), namespace, child_selector(owner_name))
        except KubeError as error:
            if error.status == 404:  # the API (e.g. monitoring.coreos.com) is not installed
                continue
            raise
        for item in items:
            found.setdefault((api_version, kind, item["metadata"]["name"]), {"apiVersion": api_version, "kind": kind, **item})
    return found


@dataclass
class Outcome:
    done: list[Action] = field(default_factory=list)
    refused: list[tuple[Action, KubeError]] = field(default_factory=list)


async def execute(kube: KubeClient, plan: Plan) -> Outcome:
    outcome = Outcome()
    for action in plan.actions:
        plural = plural_of(action.api_version, action.kind)
        try:
            if action.verb == "create":
                await kube.create(action.api_version, plural, action.namespace, action.body or {})
            elif action.verb == "update":
                await kube.replace(action.api_version, plural, action.namespace, action.name, action.body or {})
            else:
                await kube.delete(action.api_version, plural, action.namespace, action.name)
        except KubeError as error:
            if error.transient:
                raise
            outcome.refused.append((action, error))
            continue
        outcome.done.append(action)
    return outcome
