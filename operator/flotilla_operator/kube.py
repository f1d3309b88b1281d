"""A small async Kubernetes API client for the reconciler (kopf brings no client of its own).

It logs in the way kopf does (in-cluster service account first, then the standard kubeconfig) and
speaks plain JSON over aiohttp. Errors carry the API server's status, reason and message;
`KubeError.transient` tells a retry-worthy failure (throttling, 5xx, conflicts, network) from a
final one.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
from typing import Any

import aiohttp
import kopf

MERGE_PATCH = "application/merge-patch+json"
TRANSIENT_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT_STATUSES or self.status == 0


def api_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    parts = [f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _material(data: str | bytes | None, path: Any) -> str | None:
    """A file path for certificate material given inline (base64, as kubeconfig has it) or as a path."""
    if path:
        return str(path)
    if not data:
        return None
    raw = base64.b64decode(data) if isinstance(data, str) and "-----BEGIN" not in data else (
        data.encode() if isinstance(data, str) else data)
    handle = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")  # noqa: SIM115 (kept for the session)
    handle.write(raw)
    handle.close()
    return handle.name


class KubeClient:
    def __init__(self, info: kopf.ConnectionInfo, timeout_s: float = 30.0) -> None:
        self.server = info.server.rstrip("/")
        headers = {"Accept": "application/json", "User-Agent": "flotilla-operator"}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
        ssl_context: ssl.SSLContext | bool = False if info.insecure else ssl.create_default_context(
            cafile=_material(info.ca_data, info.ca_path))
        cert = _material(info.certificate_data, info.certificate_path)
        if cert and isinstance(ssl_context, ssl.SSLContext):
            ssl_context.load_cert_chain(cert, _material(info.private_key_data, info.private_key_path))
        self._session = aiohttp.ClientSession(
            headers=headers, auth=auth, timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(ssl=ssl_context if self.server.startswith("https") else False),
        )

    async def close(self) -> None:
        await self._session.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> dict[str, Any]:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        try:
            async with self._session.request(method, self.server + path, data=data, headers=headers,
                                             params=params) as response:
                text = await response.text()
                if response.status >= 400:
                    try:
                        payload = json.loads(text)
                    except ValueError:
                        payload = {}
                    raise KubeError(response.status, payload.get("reason", response.reason or ""),
                                    payload.get("message", text[:500]))
                return json.loads(text) if text else {}
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeError(0, "ConnectionError", f"{method} {path}: {error!r}") from error

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", api_path(api_version, plural, namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def list(self, api_version: str, plural: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        result = await self.request("GET", api_path(api_version, plural, namespace), params={"labelSelector": label_selector})
        return result.get("items", [])

    async def create(self, api_version: str, plural: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", api_path(api_version, plural, namespace), body)

    async def replace(self, api_version: str, plural: str, namespace: str | None, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", api_path(api_version, plural, namespace, name), body)

    async def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        return await self.request("PATCH", api_path(api_version, plural, namespace, name, subresource), patch, MERGE_PATCH)

    async def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> None:
        try:
            await self.request("DELETE", api_path(api_version, plural, namespace, name),
                               {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except KubeError as error:
            if error.status != 404:
                raise

    async def has_api_group(self, group_version: str) -> bool:
        try:
            await self.request("GET", f"/apis/{group_version}")
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True


def login() -> kopf.ConnectionInfo:
    """In-cluster service account first, then the kubeconfig, as kopf itself does."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.PermanentError("no credentials: run in a pod with a service account, or set KUBECONFIG")
    return info
