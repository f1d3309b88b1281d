"""Which pool pods may take a request for a pooled model: a pure decision by residency (docs/gateway.md,
"Residency routing").

A ModelPool's pods each hold several models in one memory budget and load the others on demand, so the pod
that already holds the model answers at once, while any other pays a cold load and may evict. `place()`
narrows the pool's pods to the best tier; `routing.choose` then picks among them with the model's policy.
The fleet simulator can import it as it is.

Rules, in order:
- a pod that does not list the model (its members file not yet re-read) is used only when no pod lists it;
- saturated pods are left out unless all are (routing.candidates);
- a second copy: the model's copies are the pods where it is loaded or loading; when its waiting requests per
  copy have stayed above `target_waiting` for SECOND_COPY_AFTER_S, and an unsaturated pod that is no copy
  has free budget for it, the request goes there (which loads it there). The pressure clock then restarts,
  so a burst starts one copy per window, not one per free pod;
- otherwise ModelMesh's order: the pods where it is loaded; else those loading it; else those with free
  budget for it (the load evicts nothing); else the pod whose least recently used idle model is oldest (the
  cheapest eviction); else (nothing idle anywhere: every pod makes it wait) all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from flotilla_contract.load import ModelState

from flotilla_gateway.routing import PodView, is_saturated

Tier = Literal["loaded", "loading", "second_copy", "free", "lru", "busy", "unlisted"]
TIERS: tuple[Tier, ...] = ("loaded", "loading", "second_copy", "free", "lru", "busy", "unlisted")
SECOND_COPY_AFTER_S = 2.0  # waiting per copy must stay above target this long (several load polls) first


@dataclass(frozen=True)
class Residence:
    """One pool pod, as it stands for one model."""

    pod: PodView
    state: ModelState | None = None  # the model's state there; None: the pod does not list it (or never reported)
    model_waiting: int = 0  # requests for this model waiting there (for a slot, or for its load)
    model_bytes: int | None = None  # what the model holds when loaded, as the pod reports it
    free_bytes: int | None = None  # the pod's memory budget not held by loaded models
    lru_idle_s: float | None = None  # seconds since its least recently used idle loaded model served; None: none idle

    @property
    def is_copy(self) -> bool:
        return self.state in ("loaded", "loading")

    @property
    def has_room(self) -> bool:
        """The model fits the pod's free budget: loading it there evicts nothing."""
        return self.free_bytes is not None and self.model_bytes is not None and self.free_bytes >= self.model_bytes


@dataclass(frozen=True)
class Placement:
    tier: Tier
    pods: tuple[PodView, ...]  # where the request may go; routing.choose picks one with the model's policy
    pressed_since_s: float | None  # when waiting per copy rose above target (remember it for the next call)


def waiting_per_copy(residences: Sequence[Residence]) -> float | None:
    """The model's waiting requests per copy; None when no pod holds or loads it."""
    copies = [r for r in residences if r.is_copy]
    return sum(r.model_waiting for r in copies) / len(copies) if copies else None


def place(residences: Sequence[Residence], target_waiting: float, pressed_since_s: float | None,
          now_s: float) -> Placement:
    """The tier a request for this model goes to, and the pressure clock to remember."""
    per_copy = waiting_per_copy(residences)
    pressed = per_copy is not None and per_copy > target_waiting
    since = (pressed_since_s if pressed_since_s is not None else now_s) if pressed else None
    listed = [r for r in residences if r.state is not None]
    if not listed:
        return Placement("unlisted", tuple(r.pod for r in residences), since)
    fresh = [r for r in listed if not is_saturated(r.pod)] or listed

    if since is not None and now_s - since >= SECOND_COPY_AFTER_S:
        spare = [r for r in fresh if not r.is_copy and r.has_room and not is_saturated(r.pod)]
        if spare:
            return Placement("second_copy", _pods(spare), now_s)  # the clock restarts: one copy per window

    for tier, members in (("loaded", [r for r in fresh if r.state == "loaded"]),
                          ("loading", [r for r in fresh if r.state == "loading"]),
                          ("free", [r for r in fresh if r.has_room])):
        if members:
            return Placement(tier, _pods(members), since)  # type: ignore[arg-type]
    ages = [r.lru_idle_s for r in fresh if r.lru_idle_s is not None]
    if ages:
        oldest = max(ages)
        return Placement("lru", _pods([r for r in fresh if r.lru_idle_s == oldest]), since)
    return Placement("busy", _pods(fresh), since)


def _pods(residences: Sequence[Residence]) -> tuple[PodView, ...]:
    return tuple(r.pod for r in residences)
