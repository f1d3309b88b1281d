"""Outlier ejection: a pod that keeps failing is taken out of rotation for a cool-down, pure (docs/gateway.md,
"Failover").

Why: a pod that answers 502 to everything, or resets every connection, still passes its readiness probe
(the probe reads /readyz, not a generation), so the endpoints keep it and every request that picks it pays a
failed attempt and a retry. Envoy's outlier detection settled the rules this follows:
- `consecutive_failures` failures in a row (connect errors, 502, a connection dropped before or during the
  answer; not 503 draining or 429, which a healthy pod answers) eject the pod;
- the cool-down is `base_ejection_s` times the number of times the pod has been ejected, capped at
  `max_ejection_s`, so a pod that fails again as soon as it is back stays out longer;
- never more than `max_ejected_fraction` of a model's pods are out at once (rounded down): with one pod,
  none is ever ejected, since a failing pod is better than none, and the retry rule still spares the client;
- a pod back from its cool-down starts from zero failures; one success clears its count.

The state is per gateway replica and in memory: a restarted gateway starts with every pod in rotation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EjectionPolicy:
    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError(f"--eject-after-failures must be >= 1, got {self.consecutive_failures}")
        if not 0 < self.base_ejection_s <= self.max_ejection_s:
            raise ValueError("--eject-base-s must be above 0 and at most the cap, got "
                             f"{self.base_ejection_s} and {self.max_ejection_s}")
        if not 0 <= self.max_ejected_fraction <= 1:
            raise ValueError(f"the ejected fraction must be in [0, 1], got {self.max_ejected_fraction}")


@dataclass
class PodHealth:
    failures: int = 0  # in a row
    ejections: int = 0  # times ejected so far
    ejected_until_s: float | None = None


@dataclass
class Ejector:
    policy: EjectionPolicy = field(default_factory=EjectionPolicy)
    pods: dict[str, PodHealth] = field(default_factory=dict)

    def ejected(self, address: str, now_s: float) -> bool:
        health = self.pods.get(address)
        if health is None or health.ejected_until_s is None:
            return False
        if now_s >= health.ejected_until_s:  # back in rotation, from zero
            health.ejected_until_s, health.failures = None, 0
            return False
        return True

    def in_rotation(self, addresses: Iterable[str], now_s: float) -> list[str]:
        return [a for a in addresses if not self.ejected(a, now_s)]

    def succeeded(self, address: str) -> None:
        health = self.pods.get(address)
        if health is not None:
            health.failures = 0

    def failed(self, address: str, model_pods: tuple[str, ...], now_s: float) -> bool:
        """Count a failure of `address` (one of `model_pods`); True when it ejects the pod now."""
        health = self.pods.setdefault(address, PodHealth())
        if self.ejected(address, now_s):
            return False
        health.failures += 1
        if health.failures < self.policy.consecutive_failures:
            return False
        out = sum(1 for pod in model_pods if pod != address and self.ejected(pod, now_s))
        if out + 1 > math.floor(self.policy.max_ejected_fraction * len(model_pods)):
            return False  # the cap: it stays in rotation, and is ejected once others are back
        health.ejections += 1
        cool_down_s = min(self.policy.base_ejection_s * health.ejections, self.policy.max_ejection_s)
        health.ejected_until_s = now_s + cool_down_s
        return True

    def forget(self, keep: set[str]) -> None:
        """Drop pods no model has any more (the endpoints removed them)."""
        for address in [a for a in self.pods if a not in keep]:
            del self.pods[address]
