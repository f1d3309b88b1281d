"""Which pod gets a request for a LoRA adapter: a pure decision beside routing.choose, imported unchanged by the
fleet simulator (flotilla_sim/adapters.py).

Why: the peers' users report adapter routing as the hard part. "Prefer the pod that has the adapter" pins a
hot adapter to one pod (llm-d-router #709); spreading every request by load makes each pod load every adapter
and evict the others (thrash); and after a scale-up adapter traffic stays on the old pods (AIBrix #1095).

Rules (`choose_for_adapter`):
- the candidates are routing.candidates(pods): saturated pods only when every pod is;
- an adapter may use `width` pods: 1 + its in-flight requests // SPREAD_LOAD (at most every candidate), so a
  cold adapter lives on one pod and a hot one grows onto more as its load rises, and shrinks back as it cools;
- which pods: its holders first (pods that report it resident, or that this gateway just sent it to), then
  the pods with the most free adapter slots (a new pod has all its slots free, so a scale-up takes adapter
  traffic at once), ties by the adapter's walk of a hash ring (routing.ring_walk: every gateway replica orders the
  same pods alike);
- within those, the least-loaded pod whose load + 1 stays within routing.load_bound, a holder before a pod of
  equal load that would have to load the adapter; if none of them fits,
  the pod within the bound with the most free adapter slots, then the least load (a hot spot spills rather
  than queues);
- ties go to the walk, so the choice is deterministic.
SPREAD_LOAD = 8: one pod takes an adapter's first 8 concurrent requests; half a pod's default slots
(`--max-num-seqs` 16 on CPU), so an adapter alone never fills a pod before it spreads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .routing import PodView, candidates, load_bound, ring_walk

SPREAD_LOAD = 8


def adapter_width(adapter_load: int, num_pods: int, spread_load: int = SPREAD_LOAD) -> int:
    """How many pods an adapter with `adapter_load` requests in flight may use."""
    return max(1, min(num_pods, 1 + adapter_load // spread_load))


def choose_for_adapter(pods: Sequence[PodView], adapter: str, holders: frozenset[str], adapter_load: int,
                       free_slots: Mapping[str, int], spread_load: int = SPREAD_LOAD) -> PodView | None:
    """The pod for a request naming `adapter`; None when there is no pod. `holders`: addresses holding it;
    `adapter_load`: its requests in flight fleet-wide (this one not counted); `free_slots`: each pod's free
    adapter slots (absent: 0)."""
    pool = candidates(list(pods))
    if not pool:
        return None
    walk = ring_walk({p.address for p in pool}, adapter)
    ordered = sorted(pool, key=lambda p: (p.address not in holders, -free_slots.get(p.address, 0), walk[p.address]))
    allowed = ordered[:adapter_width(adapter_load, len(pool), spread_load)]
    bound = load_bound(sum(p.load for p in pool), len(pool))
    fits = [p for p in allowed if p.load + 1 <= bound]
    if fits:
        return min(fits, key=lambda p: (p.load, p.address not in holders, walk[p.address]))
    spill = [p for p in pool if p.load + 1 <= bound]  # never empty: the least-loaded pod fits
    return min(spill, key=lambda p: (-free_slots.get(p.address, 0), p.load, walk[p.address]))
