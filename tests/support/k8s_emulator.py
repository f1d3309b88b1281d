"""A Kubernetes API server for tests: kmock's KubernetesEmulator with the semantics real clients need.

kmock serves discovery, routing and errors; this subclass keeps the objects itself and adds what
kopf and kubectl-like clients rely on: uid, resourceVersion, creationTimestamp, generation (bumped
on spec changes only), typed lists, label/field selectors, merge and JSON patches, the status and
scale subresources, finalizers, watches that resume from a resourceVersion, garbage collection by
owner references, and (optionally) CRD defaulting and validation including CEL rules.

Use it through `serve()`, which runs it on a free loopback port in a background thread and writes
a kubeconfig; the returned handle is a small synchronous client for the test itself:

    with serve(tmp_path, crds=[load_yaml("crds/flotilla.dev_inferencemodels.yaml")]) as k8s:
        subprocess.Popen(["flotilla-operator", "-n", "default"], env={"KUBECONFIG": k8s.kubeconfig, ...})
        k8s.create(example)
        k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "tiny", "default"))
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import attrs
import httpx
import kmock
import yaml

from tests.support import crd_schema
from tests.support.k8s_semantics import (
    body_of,
    fields_match,
    json_patch,
    labels_match,
    merge_patch,
    now_rfc3339,
)


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    scale_spec_path: str = ".spec.replicas"
    scale_status_path: str = ".status.replicas"
    scale_selector_path: str | None = None
    short_names: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None  # a CRD's openAPIV3Schema: defaulted and validated on writes

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False),
    Kind("", "v1", "events", "Event"),
    Kind("", "v1", "services", "Service", subresources=("status",)),
    Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "configmaps", "ConfigMap"),
    Kind("", "v1", "pods", "Pod", subresources=("status",)),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", subresources=("status",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount"),
    Kind("apps", "v1", "deployments", "Deployment", subresources=("status", "scale"),
         scale_selector_path=".spec.selector"),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",)),
    Kind("events.k8s.io", "v1", "events", "Event"),
    Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
         namespaced=False, subresources=("status",)),
)
MONITORING_KINDS = (
    Kind("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor"),
    Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"),
)
MAX_LOGGED_EVENTS = 20_000
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": self.code, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class AuditEntry:
    """One request as RBAC sees it: who (user agent), which verb, on what."""

    user_agent: str
    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str
    resource: str  # plural, with "/subresource" when one was addressed
    namespace: str | None

    @classmethod
    def of(cls, request: kmock.Request) -> AuditEntry:
        method, named = request._raw_request.method, request.name is not None
        if method == "GET":
            verb = "watch" if request.params.get("watch") in ("true", "1") else ("get" if named else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        return cls(request.headers.get("User-Agent", ""), verb, request.resource.group or "", resource, request.namespace)


def kind_from_crd(crd: dict[str, Any]) -> Kind:
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage", True))
    subresources = version.get("subresources", {})
    scale = subresources.get("scale", {})
    return Kind(
        spec["group"], version["name"], spec["names"]["plural"], spec["names"]["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        subresources=tuple(subresources),
        scale_spec_path=scale.get("specReplicasPath", ".spec.replicas"),
        scale_status_path=scale.get("statusReplicasPath", ".status.replicas"),
        scale_selector_path=scale.get("labelSelectorPath"),
        short_names=tuple(spec["names"].get("shortNames", ())),
        schema=version.get("schema", {}).get("openAPIV3Schema"),
    )


def _get_path(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.strip(".").split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@attrs.define(kw_only=True)
class FlotillaEmulator(kmock.KubernetesEmulator):
    """The stateful API server. All state is touched only on its event loop, so no locks."""

    garbage_collection: bool = True  # delete dependents whose every owner is gone, as kube-controller-manager does
    store: dict[tuple[str, str, str | None, str], dict[str, Any]] = attrs.field(factory=dict)
    kinds: dict[tuple[str, str], Kind] = attrs.field(factory=dict)
    log: list[tuple[int, tuple[str, str], dict[str, Any]]] = attrs.field(factory=list)
    watchers: list[tuple[tuple[str, str], asyncio.Queue[dict[str, Any]]]] = attrs.field(factory=list)
    delays_s: dict[str, float] = attrs.field(factory=dict)  # "POST deployments" → seconds, to catch clients mid-way
    failures: dict[str, int] = attrs.field(factory=dict)  # "POST deployments" → how many 503s to answer first
    audit: list[AuditEntry] = attrs.field(factory=list)  # every resource request, for RBAC checks
    _rv: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    last_rv: int = 0

    def register(self, kind: Kind) -> None:
        self.kinds[(kind.group, kind.plural)] = kind
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        self.resources[kmock.resource(kind.group, kind.version, kind.plural)] = kmock.ResourceInfo(
            kind=kind.kind, namespaced=kind.namespaced, singular=kind.kind.lower(), verbs=verbs,
            subresources=set(kind.subresources), shortnames=set(kind.short_names),
        )

    # -- the HTTP shell -------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        match = NAMESPACE_PATH.match(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        # kmock's path parser reads /api/v1/namespaces[/NAME] as a namespace prefix: parse it here.
        body = await raw_request.read()
        request = kmock.Request(
            method=raw_request.method, url=raw_request.url, params=dict(raw_request.query),
            headers=dict(raw_request.headers), body=body, data=json.loads(body) if body else None,
            resource=kmock.resource("", "v1", "namespaces"), name=match.group(1), raw_request=raw_request,
        )
        return await self._handle(request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is not None and res.plural:
            self.audit.append(AuditEntry.of(request))
        kind = self.kinds.get((res.group, res.plural)) if res is not None and res.plural else None
        if kind is None or res.version != kind.version:
            return await super()._handle(request)  # discovery, or 404 for unknown resources
        verb = f"{request._raw_request.method} {kind.plural}"
        if self.delays_s.get(verb):
            await asyncio.sleep(self.delays_s[verb])
        if self.failures.get(verb, 0) > 0:
            self.failures[verb] -= 1
            error = ApiError(503, "ServiceUnavailable", "injected by the test: the API server is overloaded")
            return aiohttp.web.json_response(error.status(), status=503)
        try:
            if request.method == kmock.method.GET and request.params.get("watch") in ("true", "1"):
                return await self._watch(kind, request)
            payload, code = self._dispatch(kind, request)
        except ApiError as error:
            return aiohttp.web.json_response(error.status(), status=error.code)
        return aiohttp.web.json_response(payload, status=code)

    def _dispatch(self, kind: Kind, request: kmock.Request) -> tuple[dict[str, Any], int]:
        ns = request.namespace if kind.namespaced else None
        method, name, sub = request.method, request.name, request.subresource
        content_type = request.headers.get("Content-Type", "application/merge-patch+json")
        if name is None:
            if method == kmock.method.GET:
                return self.list_objects(kind, ns, request.params.get("labelSelector"),
                                         request.params.get("fieldSelector")), 200
            if method == kmock.method.POST:
                return self.create(kind, ns, request.data or {}), 201
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection is not supported")
        if sub == "scale":
            return self._scale(kind, ns, name, method, request.data, content_type), 200
        if method == kmock.method.GET:
            return copy.deepcopy(self._require(kind, ns, name)), 200
        if method == kmock.method.PATCH:
            return self.patch(kind, ns, name, request.data, content_type, sub), 200
        if method == kmock.method.PUT:
            return self.replace(kind, ns, name, request.data or {}, sub), 200
        if method == kmock.method.DELETE:
            return self.delete(kind, ns, name), 200
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    async def _watch(self, kind: Kind, request: kmock.Request) -> aiohttp.web.StreamResponse:
        ns = request.namespace if kind.namespaced else None
        labels, fields = request.params.get("labelSelector"), request.params.get("fieldSelector")
        since = int(request.params.get("resourceVersion") or 0)
        timeout_s = float(request.params.get("timeoutSeconds") or 3600)

        def wanted(event: dict[str, Any]) -> bool:
            meta = event["object"].get("metadata", {})
            return ((ns is None or meta.get("namespace") == ns)
                    and labels_match(meta.get("labels") or {}, labels) and fields_match(event["object"], fields))

        key = (kind.group, kind.plural)
        if since:
            backlog = [event for rv, k, event in self.log if rv > since and k == key]
        else:
            backlog = [{"type": "ADDED", "object": obj} for (g, p, _, _), obj in self.store.items() if (g, p) == key]
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (key, queue)
        self.watchers.append(entry)  # registered in the same loop step as the backlog: no gap
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        deadline = time.monotonic() + timeout_s
        try:
            for event in backlog:
                if wanted(event):
                    await response.write(json.dumps(event).encode() + b"\n")
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=left)
                except TimeoutError:
                    break
                if wanted(event):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    # -- the object store ---------------------------------------------------------------------

    def _emit(self, kind: Kind, event_type: str, obj: dict[str, Any]) -> None:
        key = (kind.group, kind.plural)
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        self.log.append((int(obj["metadata"]["resourceVersion"]), key, event))
        del self.log[:-MAX_LOGGED_EVENTS]
        for watched, queue in self.watchers:
            if watched == key:
                queue.put_nowait(event)

    def _next_rv(self) -> str:
        self.last_rv = next(self._rv)
        return str(self.last_rv)

    def _require(self, kind: Kind, ns: str | None, name: str) -> dict[str, Any]:
        obj = self.store.get((kind.group, kind.plural, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind.plural}.{kind.group or "core"} "{name}" not found')
        return obj

    def _admit(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Defaults and validation of custom resources, as the API server does on every write."""
        if kind.schema is None:
            return obj
        obj = crd_schema.apply_defaults(kind.schema, obj)
        errors = crd_schema.validate(kind.schema, obj)
        if errors:
            name = obj.get("metadata", {}).get("name")
            raise ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: ' + "; ".join(errors))
        return obj

    def list_objects(self, kind: Kind, ns: str | None, labels: str | None = None,
                     fields: str | None = None) -> dict[str, Any]:
        items = [copy.deepcopy(obj) for (g, p, o_ns, _), obj in sorted(self.store.items(), key=lambda i: (i[0][2] or "", i[0][3]))
                 if (g, p) == (kind.group, kind.plural) and (ns is None or o_ns == ns)
                 and labels_match(obj["metadata"].get("labels") or {}, labels) and fields_match(obj, fields)]
        return {"apiVersion": kind.api_version, "kind": f"{kind.kind}List",
                "metadata": {"resourceVersion": str(self.last_rv)}, "items": items}

    def create(self, kind: Kind, ns: str | None, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{kind.kind}: metadata.name is required")
        key = (kind.group, kind.plural, ns, meta["name"])
        if key in self.store:
            raise ApiError(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists')
        if "status" in kind.subresources:
            obj.pop("status", None)  # status is written through its subresource only
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        obj = self._admit(kind, obj)
        meta = obj["metadata"]
        if ns is not None:
            meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1,
                    resourceVersion=self._next_rv())
        self.store[key] = obj
        if kind.kind == "CustomResourceDefinition":
            self.register(kind_from_crd(obj))
        self._emit(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    def _write(self, kind: Kind, ns: str | None, name: str, new: dict[str, Any], sub: str | None) -> dict[str, Any]:
        """Store a new version of an existing object, keeping what its subresource rules protect."""
        old = self._require(kind, ns, name)
        if "status" in kind.subresources:
            if sub == "status":
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    del new["status"]
            elif "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        old_meta = old["metadata"]
        meta = new.setdefault("metadata", {})
        rv = meta.get("resourceVersion")
        if rv is not None and rv != old_meta["resourceVersion"]:
            raise ApiError(409, "Conflict", f'the object "{name}" has been modified; apply your changes to the latest version')
        for frozen in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion", "deletionTimestamp"):
            if frozen in old_meta:
                meta[frozen] = old_meta[frozen]
            else:
                meta.pop(frozen, None)
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        new = self._admit(kind, new)
        if new == old:
            return copy.deepcopy(old)  # a no-op write changes nothing, not even resourceVersion
        if body_of(new) != body_of(old):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.store[(kind.group, kind.plural, ns, name)] = new
            return self._remove(kind, ns, name)
        self.store[(kind.group, kind.plural, ns, name)] = new
        self._emit(kind, "MODIFIED", new)
        return copy.deepcopy(new)

    def patch(self, kind: Kind, ns: str | None, name: str, patch: Any, content_type: str,
              sub: str | None = None) -> dict[str, Any]:
        old = self._require(kind, ns, name)
        try:
            new = json_patch(old, patch) if "json-patch" in content_type else merge_patch(old, patch or {})
        except (ValueError, KeyError, IndexError) as error:
            raise ApiError(422, "Invalid", f"cannot apply the patch: {error}") from error
        return self._write(kind, ns, name, new, sub)

    def replace(self, kind: Kind, ns: str | None, name: str, body: dict[str, Any], sub: str | None = None) -> dict[str, Any]:
        return self._write(kind, ns, name, copy.deepcopy(body), sub)

    def delete(self, kind: Kind, ns: str | None, name: str) -> dict[str, Any]:
        obj = self._require(kind, ns, name)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(obj)
                obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self.store[(kind.group, kind.plural, ns, name)] = obj
                self._emit(kind, "MODIFIED", obj)
            return copy.deepcopy(obj)
        return self._remove(kind, ns, name)

    def _remove(self, kind: Kind, ns: str | None, name: str) -> dict[str, Any]:
        obj = self.store.pop((kind.group, kind.plural, ns, name))
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(kind, "DELETED", obj)
        if self.garbage_collection:
            self._collect_dependents(obj["metadata"]["uid"])
        return obj

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background cascading deletion: a dependent goes when no owner of it is left."""
        live_uids = {o["metadata"]["uid"] for o in self.store.values()}
        for (group, plural, ns, name), obj in list(self.store.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            orphaned = any(r.get("uid") == owner_uid for r in refs) and not any(r.get("uid") in live_uids for r in refs)
            if orphaned and (group, plural, ns, name) in self.store:  # an earlier cascade may have taken it
                self.delete(self.kinds[(group, plural)], ns, name)

    def _scale(self, kind: Kind, ns: str | None, name: str, method: kmock.method, body: Any,
               content_type: str) -> dict[str, Any]:
        if "scale" not in kind.subresources:
            raise ApiError(404, "NotFound", f"{kind.plural} has no scale subresource")
        obj = self._require(kind, ns, name)
        if method in (kmock.method.PATCH, kmock.method.PUT):
            scale = self._scale_view(kind, obj)
            scale = json_patch(scale, body) if "json-patch" in content_type else merge_patch(scale, body or {})
            new = copy.deepcopy(obj)
            _set_path(new, kind.scale_spec_path, int(scale["spec"]["replicas"]))
            obj = self._write(kind, ns, name, new, None)
        return self._scale_view(kind, obj)

    def _scale_view(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        selector = _get_path(obj, kind.scale_selector_path) if kind.scale_selector_path else None
        if isinstance(selector, dict):
            selector = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
        meta = obj["metadata"]
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "spec": {"replicas": _get_path(obj, kind.scale_spec_path) or 0},
            "status": {"replicas": _get_path(obj, kind.scale_status_path) or 0, "selector": selector or ""},
        }


def write_kubeconfig(path: Path, url: str, namespace: str = "default", token_file: Path | None = None) -> Path:
    """A kubeconfig for the emulator; `token_file`: the user's token is read from that file (tokenFile)."""
    user = {"tokenFile": str(token_file)} if token_file else {"token": "emulator-token"}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": user}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}],
    }))
    return path


def api_path(api_version: str, plural: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base] + ([f"namespaces/{namespace}"] if namespace else []) + [plural]
    parts += [name] if name else []
    parts += [subresource] if subresource else []
    return "/".join(parts)


@dataclass
class EmulatorHandle:
    """A running emulator: its URL and kubeconfig, plus a synchronous client for tests."""

    url: str
    kubeconfig: str
    emulator: FlotillaEmulator
    http: httpx.Client

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.json().get("reason", ""), response.text)
        return response.json()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        plural = self.plural(obj["apiVersion"], obj["kind"])
        return self.request("POST", api_path(obj["apiVersion"], plural, namespace=meta.get("namespace")), json=obj)

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = None,
            subresource: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        response = self.http.get(api_path(api_version, plural, name, namespace, subresource))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def list(self, api_version: str, plural: str, namespace: str | None = None, labels: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": labels} if labels else {}
        return self.request("GET", api_path(api_version, plural, namespace=namespace), params=params)["items"]

    def patch(self, api_version: str, plural: str, name: str, namespace: str | None, patch: Any,
              subresource: str | None = None, content_type: str = "application/merge-patch+json") -> dict[str, Any]:
        return self.request("PATCH", api_path(api_version, plural, name, namespace, subresource),
                            content=json.dumps(patch), headers={"Content-Type": content_type})

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.request("DELETE", api_path(api_version, plural, name, namespace))

    def plural(self, api_version: str, kind_name: str) -> str:
        group = api_version.rpartition("/")[0]
        for kind in list(self.emulator.kinds.values()):
            if kind.group == group and kind.kind == kind_name:
                return kind.plural
        raise KeyError(f"the emulator serves no {kind_name} in {api_version}")

    def eventually(self, check: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.1,
                   message: str = "condition") -> Any:
        """Poll `check` until it returns a truthy value (returned) or raise AssertionError."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(interval_s)
        raise AssertionError(f"{message} not reached within {timeout_s} s (last value: {last!r})")


@contextlib.contextmanager
def serve(directory: Path, crds: list[dict[str, Any]] = (), monitoring: bool = False,
          namespaces: tuple[str, ...] = ("default",), garbage_collection: bool = True,
          emulator: FlotillaEmulator | None = None) -> Iterator[EmulatorHandle]:
    """Run an emulator on 127.0.0.1:<free port> in a thread; write `directory/kubeconfig` pointing at it.

    `crds` are registered (their schemas default and validate writes); `monitoring` also serves the
    monitoring.coreos.com kinds, as if the Prometheus operator were installed. `emulator`: a subclass
    instance to serve instead (k8s_auth.TokenEmulator); one with a `token_file` gets a kubeconfig that
    reads it, and the handle's own client sends the token in that file at each request.
    """
    if emulator is None:
        emulator = FlotillaEmulator(garbage_collection=garbage_collection)
    for kind in BUILTIN_KINDS + (MONITORING_KINDS if monitoring else ()):
        emulator.register(kind)
    for crd in crds:
        emulator.register(kind_from_crd(crd))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        async with emulator:
            server = aiohttp.test_utils.RawTestServer(emulator, host="127.0.0.1", port=0)
            await server.start_server()
            holder["url"], holder["stop"] = str(server.make_url("")).rstrip("/"), asyncio.Event()
            started.set()
            await holder["stop"].wait()
            await server.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), name="k8s-emulator", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the Kubernetes emulator did not start within 10 s")
    url = holder["url"]
    token_file: Path | None = getattr(emulator, "token_file", None)
    kubeconfig = write_kubeconfig(directory / "kubeconfig", url, token_file=token_file)

    def authorize(request: httpx.Request) -> None:
        if token_file is not None:
            request.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"

    http = httpx.Client(base_url=url, timeout=10, event_hooks={"request": [authorize]})
    handle = EmulatorHandle(url, str(kubeconfig), emulator, http)
    for ns in namespaces:
        handle.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        yield handle
    finally:
        handle.http.close()
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(10)
        loop.close()
