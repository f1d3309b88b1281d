"""A small async Kubernetes API client for the reconciler and autoscaler, on kopf's event loop.

Requests are plain JSON over aiohttp; credentials come from the `kubernetes` package's loaders
(credentials.py). The Authorization header is taken fresh on every request, and a 401 logs in again
and retries that request once, so rotated service-account tokens and expiring exec-plugin logins keep
working (docs/architecture.md, "Credentials"). Errors carry the API server's status, reason and
message; `KubeError.transient` tells a retry-worthy failure (throttling, 5xx, conflicts, network)
from a final one.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp

from flotilla_operator import credentials

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


class KubeClient:
    def __init__(self, login: Callable[[], credentials.Login] = credentials.login,
                 current: credentials.Login | None = None, timeout_s: float = 30.0) -> None:
        """`login` is called again after a 401; `current` is a login already made (else `login()` now)."""
        self._login, self._timeout_s = login, timeout_s
        self._current = current or login()
        self._session = self._new_session()
        self._retired: list[aiohttp.ClientSession] = []  # sessions of older TLS material, closed by close()
        self._login_lock = asyncio.Lock()
        self.logins = 1  # how many times credentials were loaded (a 401 adds one)

    @property
    def server(self) -> str:
        return self._current.server

    def _new_session(self) -> aiohttp.ClientSession:
        configuration = self._current.configuration
        ssl_context: ssl.SSLContext | bool = False
        if self.server.startswith("https"):
            if configuration.verify_ssl:
                ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            else:
                ssl_context = ssl.create_default_context()
                ssl_context.check_hostname, ssl_context.verify_mode = False, ssl.CERT_NONE
            if configuration.cert_file:
                ssl_context.load_cert_chain(configuration.cert_file, configuration.key_file)
        return aiohttp.ClientSession(
            headers={"Accept": "application/json", "User-Agent": "flotilla-operator"},
            timeout=aiohttp.ClientTimeout(total=self._timeout_s), connector=aiohttp.TCPConnector(ssl=ssl_context),
        )

    @staticmethod
    def _tls_of(login: credentials.Login) -> tuple[Any, ...]:
        c = login.configuration
        return c.host, c.verify_ssl, c.ssl_ca_cert, c.cert_file, c.key_file

    async def _log_in_again(self, refused: credentials.Login) -> None:
        """Reload credentials from scratch (a rotated token file, a refreshed exec plugin login).

        Rule: one login per refused credential. Requests refused together log in once; the others
        retry with the login already made. Requests in flight keep their session: a session is
        replaced only when the TLS material changed, and the old one is closed by close().
        """
        async with self._login_lock:
            if self._current is not refused:
                return  # another request already logged in again
            fresh = await asyncio.to_thread(self._login)  # exec plugins run a process: off the loop
            if self._tls_of(fresh) != self._tls_of(self._current):
                self._retired.append(self._session)
                self._current = fresh
                self._session = self._new_session()
            self._current = fresh
            self.logins += 1

    async def close(self) -> None:
        for session in [*self._retired, self._session]:
            await session.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> dict[str, Any]:
        """One API call; on 401, log in again and retry it once."""
        used = self._current
        try:
            return await self._request_once(method, path, body, content_type, params)
        except KubeError as error:
            if error.status != 401:
                raise
        await self._log_in_again(refused=used)
        return await self._request_once(method, path, body, content_type, params)

    async def _request_once(self, method: str, path: str, body: Any, content_type: str,
                            params: dict[str, str] | None) -> dict[str, Any]:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        if authorization := self._current.authorization():
            headers["Authorization"] = authorization
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
