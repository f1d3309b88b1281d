"""Decide whether a ClusterRole's rules allow a request, as the Kubernetes RBAC authorizer does."""

from __future__ import annotations

from typing import Any


def allows(rules: list[dict[str, Any]], verb: str, group: str, resource: str) -> bool:
    for rule in rules:
        if ("*" in rule.get("apiGroups", []) or group in rule.get("apiGroups", [])) and \
                ("*" in rule.get("resources", []) or resource in rule.get("resources", [])) and \
                ("*" in rule.get("verbs", []) or verb in rule.get("verbs", [])):
            return True
    return False
