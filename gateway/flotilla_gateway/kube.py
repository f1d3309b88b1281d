"""A small asynchronous Kubernetes API client: list, watch and patch, over aiohttp.

The gateway needs four verbs on three resources, on the same event loop as its proxy; the `kubernetes`
package is used only to read credentials (a kubeconfig, or the pod's service account in the cluster),
so every authentication method it supports works here too.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

MODELS = ("flotilla.dev", "v1alpha1", "inferencemodels")
POOLS = ("flotilla.dev", "v1alpha1", "modelpools")
ENDPOINT_SLICES = ("discovery.k8s.io", "v1", "endpointslices")


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base] + ([f"namespaces/{namespace}"] if namespace else []) + [self.plural]
        parts += [name] if name else []
        parts += [subresource] if subresource else []
        return "/".join(parts)


class KubeClient:
    def __init__(self, kubeconfig: str | None = None, in_cluster: bool = False) -> None:
        from kubernetes import client, config  # credentials only

        self._config = client.Configuration()
        if in_cluster:
            config.load_incluster_config(client_configuration=self._config)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=self._config)
        self.host = self._config.host.rstrip("/")
        self._ssl: ssl.SSLContext | bool = False
        if self.host.startswith("https"):
            context = ssl.create_default_context(cafile=self._config.ssl_ca_cert)
            if self._config.cert_file:
                context.load_cert_chain(self._config.cert_file, self._config.key_file)
            if not self._config.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl = context
        self._session: aiohttp.ClientSession | None = None

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        if self._config.refresh_api_key_hook is not None:
            self._config.refresh_api_key_hook(self._config)
        headers = {"Accept": "application/json", "User-Agent": "flotilla-gateway"}
        token = self._config.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str | None = None,
                      params: dict[str, str] | None = None) -> dict[str, Any]:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(method, self.host + path, data=data, params=params,
                                        headers=self._headers(content_type),
                                        timeout=aiohttp.ClientTimeout(total=30)) as response:
            text = await response.text()
            if response.status >= 400:
                raise KubeError(response.status, text[:500])
            return json.loads(text) if text else {}

    async def list(self, resource: Resource, namespace: str | None, labels: str | None = None) -> dict[str, Any]:
        params = {"labelSelector": labels} if labels else None
        return await self.request("GET", resource.path(namespace), params=params)

    async def watch(self, resource: Resource, namespace: str | None, resource_version: str,
                    labels: str | None = None, timeout_s: int = 300) -> AsyncIterator[dict[str, Any]]:
        """Events after `resource_version`, until the server ends the watch; 410 Gone raises KubeError."""
        params = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(timeout_s)}
        if labels:
            params["labelSelector"] = labels
        async with self.session.get(self.host + resource.path(namespace), params=params, headers=self._headers(),
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30)) as response:
            if response.status >= 400:
                raise KubeError(response.status, (await response.text())[:500])
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        raise KubeError(int(event.get("object", {}).get("code") or 500),
                                        event.get("object", {}).get("message", "watch error"))
                    yield event

    async def patch(self, resource: Resource, namespace: str, name: str, patch: Any, *,
                    json_patch: bool = False, subresource: str | None = None) -> dict[str, Any]:
        content_type = "application/json-patch+json" if json_patch else "application/merge-patch+json"
        return await self.request("PATCH", resource.path(namespace, name, subresource), patch, content_type)


MODELS_RESOURCE = Resource(*MODELS)
POOLS_RESOURCE = Resource(*POOLS)
ENDPOINT_SLICES_RESOURCE = Resource(*ENDPOINT_SLICES)
