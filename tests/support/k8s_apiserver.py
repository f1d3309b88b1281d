"""The stateful test API server: kmock's KubernetesEmulator plus the semantics real clients rely on.

See `k8s_emulator.py` for what it does and how to run it (`serve()`); the kinds it serves and its
errors are in `k8s_kinds.py`, the rules of patches, selectors and generations in `k8s_semantics.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import time
import uuid
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import attrs
import kmock

from tests.support import crd_schema, k8s_defaults
from tests.support.k8s_kinds import (
    MAX_LOGGED_EVENTS,
    NAMESPACE_PATH,
    ApiError,
    AuditEntry,
    Kind,
    _get_path,
    _set_path,
    kind_from_crd,
)
from tests.support.k8s_semantics import (
    body_of,
    fields_match,
    json_patch,
    labels_match,
    merge_patch,
    now_rfc3339,
)


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

    def _admit(self, kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        """Defaults (built-in kinds: k8s_defaults; custom resources: their schema) and validation, on every write."""
        if kind.schema is None:
            try:
                return k8s_defaults.apply_defaults(kind.kind, obj, old)
            except ValueError as error:
                name = obj.get("metadata", {}).get("name")
                raise ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: {error}') from error
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
        created = copy.deepcopy(obj)
        if self.garbage_collection and self._owners_gone(obj):
            self.delete(kind, ns, meta["name"])  # created after its owner went: the collector takes it
        return created

    def _owners_gone(self, obj: dict[str, Any]) -> bool:
        """Every owner reference names an object that no longer exists (kube-controller-manager's rule)."""
        refs = obj["metadata"].get("ownerReferences") or []
        live_uids = {o["metadata"]["uid"] for o in self.store.values()}
        return bool(refs) and not any(r.get("uid") in live_uids for r in refs)

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
        new = self._admit(kind, new, old)
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


