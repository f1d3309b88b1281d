"""A pooled InferenceModel's side of joining a ModelPool: its children and the problems that stop it joining.

A cost-first model that names a pool gets no Deployment and no PDB of its own: its own Deployment, if it
had one, is deleted once it has joined, and it keeps a Service (its usual endpoint) fronting the pool's
pods. The pool's members ConfigMap, not this model, tells the servers to load it (docs/pools.md).
A model joins only when nothing stops it: a pool it can read, a source the pool can load, and a served name
no older InferenceModel holds (served_names.py); until then whatever serves it keeps serving it.
"""

from __future__ import annotations

from typing import Any

import pydantic

from flotilla_operator import pool_types, types
from flotilla_operator.kube import KubeClient
from flotilla_operator.manifests import Owner
from flotilla_operator.pool_manifests import build_member_service, desired_pool_replicas, pool_deployment_name
from flotilla_operator.pool_members import POOL_NOT_FOUND, member_source
from flotilla_operator.status import Problem

# Once joined, the model's own Deployment, PDB and adapter list ConfigMap are no longer wanted and are deleted
# (its adapters are lines of the pool's members file).
JOINED_PRUNABLE_KINDS = (("apps/v1", "Deployment"), ("policy/v1", "PodDisruptionBudget"), ("v1", "ConfigMap"))


async def read_pool(kube: KubeClient, namespace: str, pool_name: str) -> pool_types.ModelPoolSpec | None:
    obj = await kube.get(types.API_VERSION, pool_types.PLURAL, namespace, pool_name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    try:
        return pool_types.parse_pool_spec(obj.get("spec") or {})
    except pydantic.ValidationError:
        return None


async def member_children(kube: KubeClient, owner: Owner, default_image: str, name_conflict: Problem | None
                          ) -> tuple[list[dict[str, Any]], tuple[tuple[str, str], ...], list[Problem]]:
    """(desired children, prunable kinds, problems) of a cost-first model naming a pool; `name_conflict` is
    served_names.name_conflict's answer for it (pool_reconciler.list_members leaves it out of the file by the same)."""
    pool_name = owner.spec.pool or ""
    problems = [name_conflict] if name_conflict is not None else []
    pool = await read_pool(kube, owner.namespace, pool_name)
    if pool is None:
        problems.append(Problem(POOL_NOT_FOUND, f'ModelPool "{pool_name}" does not exist in namespace "{owner.namespace}" '
                                "(or cannot be read); create it, or remove spec.pool to give the model its own Deployment"))
    elif isinstance(source := member_source(owner.spec, pool), Problem):
        problems.append(source)
    if problems:
        return [], (), problems  # not joined: whatever serves the model now keeps serving it
    return [build_member_service(owner, default_image)], JOINED_PRUNABLE_KINDS, []


async def pool_serving(kube: KubeClient, spec: types.InferenceModelSpec, namespace: str
                       ) -> tuple[int, dict[str, Any] | None] | None:
    """(the pool's desired replicas, its Deployment), what a member's status reports; None: not a member."""
    pool_name = spec.pool or ""
    pool = await read_pool(kube, namespace, pool_name)
    if pool is None or isinstance(member_source(spec, pool), Problem):
        return None  # not joined: its status is its own (and its Degraded condition says why)
    deployment = await kube.get("apps/v1", "deployments", namespace, pool_deployment_name(pool_name))
    return desired_pool_replicas(pool), deployment
