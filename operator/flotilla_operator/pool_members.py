"""Pool membership policy: which InferenceModels join a ModelPool, and from where its servers load them.

Pure functions of specs (docs/pools.md, "Members"). A pod's spec cannot grow an init container per new
member without a restart, so a pool takes only members whose weights its pods reach as they are: a
`builtin` model, or a `pvc` model on the pool's own volume (mounted at /models in every pool pod).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flotilla_contract.model_list import ListEntry, entry_problem, format_model_list

from flotilla_operator.adapters import claim_mount_path
from flotilla_operator.model_source import MODELS_DIR
from flotilla_operator.pool_types import ModelPoolSpec
from flotilla_operator.status import Problem
from flotilla_operator.tier_state import model_children
from flotilla_operator.types import InferenceModelSpec

SOURCE_NOT_POOLABLE = "SourceNotPoolable"
POOL_NOT_FOUND = "PoolNotFound"
NOT_LISTABLE = "NotListable"  # its name or path cannot be a line of the members file


@dataclass(frozen=True)
class MemberAdapter:
    name: str  # what a request sends as `model`
    source: str  # the PEFT directory in a pool pod: under /models (the pool's volume) or /adapters/pvc/CLAIM
    claim: str | None = None  # the claim the pool's pods must mount for it; None: the pool's own volume


@dataclass(frozen=True)
class Member:
    name: str  # the InferenceModel
    model: str  # the served model name clients send
    source: str  # what the pool's servers load: `tiny`, or a directory under /models
    quantization: str | None = None  # the InferenceModel's spec.server.quantization; None: the pool's
    adapters: tuple[MemberAdapter, ...] = ()  # spec.adapters, as lines `NAME=SOURCE base=MODEL` of the file


def joins_pool(spec: InferenceModelSpec, status: Mapping[str, Any] | None = None) -> bool:
    """Whether the pool's members file lists the model: a cost-first model naming a pool joins it; an adaptive
    one is listed while its tier (status, tier_state.py) has it in the pool or moving in or out; a latency-first
    one keeps its own Deployment."""
    return model_children(spec, status, 0).pool_member


def member_source(spec: InferenceModelSpec, pool: ModelPoolSpec) -> str | Problem:
    """Where the pool's servers find this model's weights, or why they cannot."""
    source = spec.model.source
    found: str | None = None
    claim = pool.volume.claim_name if pool.volume is not None else None
    if source.builtin is not None:
        found = source.builtin
    elif source.pvc is not None and source.pvc.claim_name == claim:
        path = source.pvc.path.strip("/")
        found = f"{MODELS_DIR}/{path}" if path else MODELS_DIR
    if found is not None:
        listed = _listable(spec, found)
        adapters = member_adapters(spec, pool)
        return adapters if isinstance(adapters, Problem) else listed
    kind = "pvc" if source.pvc is not None else "huggingface" if source.huggingface is not None else "image"
    if claim is None:
        how = (f"give ModelPool {spec.pool} a spec.volume.claimName, copy the model's files into that claim, "
               "and set spec.model.source to pvc with that claimName and the directory as path")
    else:
        how = (f"copy the model's files into PersistentVolumeClaim {claim!r} (ModelPool {spec.pool}'s volume) and set "
               f"spec.model.source to pvc: {{claimName: {claim}, path: <the directory>}}")
    if kind == "pvc":
        what = f"claim {source.pvc.claim_name!r} is not the pool's volume" if source.pvc else ""
    else:
        what = f"a {kind} source needs an init container per pod, which would restart the pool's pods"
    return Problem(SOURCE_NOT_POOLABLE, f"ModelPool {spec.pool} cannot load this model: {what}; {how}, "
                                        "or remove spec.pool to give the model its own Deployment")


def _listable(spec: InferenceModelSpec, source: str) -> str | Problem:
    """`source`, or why the servers' strict reading of the members file would refuse this model's line."""
    problem = entry_problem(spec.model.name, source)
    if problem is None:
        return source
    return Problem(NOT_LISTABLE, f"ModelPool {spec.pool} cannot list this model: {problem}; rename "
                                 "spec.model.name or the model's path, or remove spec.pool to give the model its "
                                 "own Deployment")


def _join(base: str, sub: str) -> str:
    sub = sub.strip("/")
    return f"{base}/{sub}" if sub else base


def member_adapters(spec: InferenceModelSpec, pool: ModelPoolSpec) -> tuple[MemberAdapter, ...] | Problem:
    """Where the pool's servers find each of the model's adapters, or why they cannot: a `pvc` adapter on the
    pool's volume lies under /models; one on another claim under /adapters/pvc/CLAIM, a claim the pool's pods
    then mount (a claim new to the pool changes its pod template: a rolling restart). An `image` adapter would
    need an init container in every pool pod, so a model with one does not join (as an image model does not)."""
    claim = pool.volume.claim_name if pool.volume is not None else None
    found = []
    for adapter in spec.adapters:
        pvc = adapter.source.pvc
        if pvc is None:
            return Problem(SOURCE_NOT_POOLABLE, f"ModelPool {spec.pool} cannot serve adapter {adapter.name!r}: an image "
                           "adapter needs an init container per pod, which would restart the pool's pods; copy its "
                           "directory into a PersistentVolumeClaim and set its source to pvc, or remove spec.pool to "
                           "give the model its own Deployment")
        on_volume = pvc.claim_name == claim
        source = _join(MODELS_DIR if on_volume else claim_mount_path(pvc.claim_name), pvc.path)
        problem = entry_problem(adapter.name, source, base=spec.model.name)
        if problem is not None:
            return Problem(NOT_LISTABLE, f"ModelPool {spec.pool} cannot list adapter {adapter.name!r}: {problem}; "
                           "rename the adapter or its path")
        found.append(MemberAdapter(adapter.name, source, None if on_volume else pvc.claim_name))
    return tuple(found)


def members(models: Iterable[tuple[str, InferenceModelSpec]], pool_name: str, pool: ModelPoolSpec,
            statuses: Mapping[str, Mapping[str, Any]] | None = None) -> list[Member]:
    """The pool's members, by served name: models naming it that join it (`statuses`, by InferenceModel name, say
    where adaptive ones are) and whose source it can load."""
    found = []
    for name, spec in models:
        if spec.pool != pool_name or not joins_pool(spec, (statuses or {}).get(name)):
            continue
        source = member_source(spec, pool)
        adapters = member_adapters(spec, pool)
        if isinstance(source, str) and not isinstance(adapters, Problem):
            found.append(Member(name, spec.model.name, source, spec.server.quantization, adapters))
    return sorted(found, key=lambda m: (m.model, m.name))


def members_file(found: Iterable[Member]) -> str:
    """The model list file the pool's servers re-read: one `NAME=SOURCE` a line, in the grammar they parse
    strictly (flotilla_contract.model_list); `members` only returns members it can write.

    Two members serving the same model name: the first by InferenceModel name wins (one entry per name), and
    only its adapters are listed. Each adapter follows as `NAME=SOURCE base=MODEL`, models first: an adapter
    whose name a model line or an earlier adapter already gives is left out (the file gives a name once).
    """
    found = list(found)
    entries: dict[str, ListEntry] = {}
    winners: dict[str, Member] = {}
    for member in found:
        if member.model not in entries:
            entries[member.model] = ListEntry(member.model, member.source, member.quantization)
            winners[member.model] = member
    models = sorted(entries.values(), key=lambda e: e.name)
    adapters: dict[str, ListEntry] = {}
    for model in models:
        for adapter in winners[model.name].adapters:
            if adapter.name not in entries and adapter.name not in adapters:
                adapters[adapter.name] = ListEntry(adapter.name, adapter.source, base=model.name)
    return format_model_list(models + list(adapters.values()))


def adapter_claims(found: Iterable[Member]) -> list[str]:
    """The claims, other than the pool's volume, that the pool's pods mount for its members' adapters (sorted)."""
    return sorted({a.claim for member in found for a in member.adapters if a.claim is not None})
