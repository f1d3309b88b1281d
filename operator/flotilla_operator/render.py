"""`flotilla-operator render -f FILE.yaml`: the children an InferenceModel or a ModelPool would get, with no cluster.

Like `helm template`, it shows what would be applied before anything is: the Service, the Deployment,
the PodDisruptionBudget (latency-first), the NetworkPolicy (spec.networkPolicy) and, when `--service-monitor`
says the Prometheus operator is installed, the ServiceMonitor, with every default filled in. It uses the same
pure builders as the reconciler (manifests.desired_children), so what it prints is what the operator creates,
plus one child only render emits: the InferencePool of spec.gateway.inferencePool, for a gateway of the Gateway
API Inference Extension (inference_pool.py). With no cluster there is no uid to point at, so the owner
references are left out unless the input carries `metadata.uid` (as `kubectl get -o yaml` output does). A
ModelPool's members are the file's own InferenceModels, and a pooled model's pool must be in the same file
(docs/pools.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import pydantic
import yaml

from flotilla_operator import pool_types, types
from flotilla_operator.inference_pool import with_inference_pool
from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.pool_manifests import PoolOwner, build_member_service, desired_pool_children
from flotilla_operator.pool_members import joins_pool, member_source, members
from flotilla_operator.status import Problem


class RenderError(Exception):
    """Input that cannot be rendered; the message says what to change."""


def add_arguments(parser: argparse.ArgumentParser, default_image: str) -> None:
    parser.add_argument("-f", "--filename", required=True, metavar="FILE",
                        help="InferenceModel and ModelPool manifest(s), one or more YAML documents; '-' reads stdin")
    parser.add_argument("--service-monitor", action="store_true",
                        help="also render the ServiceMonitor (the operator does when monitoring.coreos.com/v1 is served)")
    parser.add_argument("--default-image", default=default_image,
                        help="flotilla-server image for models that set no spec.image (default: %(default)s)")


KINDS = (types.KIND, pool_types.KIND)
Spec = TypeVar("Spec", types.InferenceModelSpec, pool_types.ModelPoolSpec)


def _parsed(obj: dict[str, Any], parse: Callable[[dict[str, Any]], Spec]) -> Spec:
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        raise RenderError(f"metadata.name is missing; give the {obj.get('kind')} a name")
    try:
        return parse(obj.get("spec") or {})
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise RenderError(f"{meta['name']}: spec.{where}: {first['msg']}; fix it and render again") from error


def _check_kind(obj: dict[str, Any]) -> None:
    if obj.get("apiVersion") != types.API_VERSION or obj.get("kind") not in KINDS:
        raise RenderError(f"expected apiVersion: {types.API_VERSION} and kind: {' or '.join(KINDS)}, "
                          f"got {obj.get('apiVersion')!r} {obj.get('kind')!r}; render takes InferenceModel and ModelPool manifests")


def children_of(obj: dict[str, Any], default_image: str, service_monitor: bool,
                pools: dict[tuple[str, str], pool_types.ModelPoolSpec] | None = None) -> list[dict[str, Any]]:
    """The children of one InferenceModel document, defaults applied; `pools` are the file's ModelPools."""
    _check_kind(obj)
    spec = _parsed(obj, types.parse_spec)
    meta = obj["metadata"]
    uid, namespace = meta.get("uid"), meta.get("namespace") or "default"
    owner = Owner(meta["name"], namespace, uid or "", spec)
    if joins_pool(spec):
        pool = (pools or {}).get((namespace, spec.pool or ""))
        if pool is None:
            raise RenderError(f"{meta['name']}: spec.pool names ModelPool {spec.pool!r}, which is not in the file; "
                              "render the pool and its members together")
        if isinstance(problem := member_source(spec, pool), Problem):
            raise RenderError(f"{meta['name']}: {problem.reason}: {problem.message}")
        children = [build_member_service(owner, default_image)]
    else:
        children = desired_children(owner, default_image, service_monitor)
    return _without_owner(with_inference_pool(owner, default_image, children), uid)


def pool_children_of(obj: dict[str, Any], models: list[dict[str, Any]], default_image: str,
                     service_monitor: bool = False) -> list[dict[str, Any]]:
    """The children of one ModelPool document, its members taken from the file's InferenceModels."""
    spec = _parsed(obj, pool_types.parse_pool_spec)
    meta = obj["metadata"]
    uid, namespace = meta.get("uid"), meta.get("namespace") or "default"
    in_namespace = [(m["metadata"]["name"], _parsed(m, types.parse_spec)) for m in models
                    if (m["metadata"].get("namespace") or "default") == namespace]
    found = members(in_namespace, meta["name"], spec)
    children = desired_pool_children(PoolOwner(meta["name"], namespace, uid or "", spec), found, default_image,
                                     service_monitor)
    return _without_owner(children, uid)


def _without_owner(children: list[dict[str, Any]], uid: str | None) -> list[dict[str, Any]]:
    if not uid:
        for child in children:
            child["metadata"].pop("ownerReferences", None)
    return children


def render(text: str, default_image: str, service_monitor: bool) -> list[dict[str, Any]]:
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise RenderError(f"the file is not valid YAML: {error}") from error
    if not documents:
        raise RenderError("the file holds no YAML document; give an InferenceModel or ModelPool manifest")
    for doc in documents:
        _check_kind(doc)
    models = [doc for doc in documents if doc["kind"] == types.KIND]
    pools = {((doc.get("metadata") or {}).get("namespace") or "default", (doc.get("metadata") or {}).get("name", "")):
             _parsed(doc, pool_types.parse_pool_spec) for doc in documents if doc["kind"] == pool_types.KIND}
    children = []
    for doc in documents:
        if doc["kind"] == pool_types.KIND:
            children += pool_children_of(doc, models, default_image, service_monitor)
        else:
            children += children_of(doc, default_image, service_monitor, pools)
    return children


def run(args: argparse.Namespace, stdout: TextIO = sys.stdout) -> int:
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        children = render(text, args.default_image, args.service_monitor)
    except OSError as error:
        print(f"flotilla-operator render: cannot read {args.filename}: {error.strerror}; check the path", file=sys.stderr)
        return 2
    except RenderError as error:
        print(f"flotilla-operator render: {args.filename}: {error}", file=sys.stderr)
        return 2
    stdout.write(yaml.safe_dump_all(children, sort_keys=False, width=120, explicit_start=True))
    return 0
