"""`--api-key`: with a key set, the OpenAI endpoints answer only requests that carry it, as vLLM's flag does.

Anyone who reaches a model's Service could otherwise use it, around the gateway's own keys
(docs/gateway.md, "Keys between the gateway and the servers"). Only the OpenAI API (`/v1/...`) is
guarded: the kubelet's probes (/healthz, /readyz), Prometheus (/metrics) and the gateway's load poll
(/flotilla/v1/load) carry no key and stay open. The comparison takes the same time whatever the key sent.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from flotilla_server.http.errors import error_body

GUARDED_PREFIX = "/v1/"


class ApiKeyGuard:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED_PREFIX):
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(sent, self._expected):
            await self.app(scope, receive, send)
            return
        message = ("Missing API key: send it as 'Authorization: Bearer <key>' (the OpenAI SDK's api_key)."
                   if not sent else "Incorrect API key: send the key this server was started with (--api-key).")
        body = error_body(401, message, code="invalid_api_key")
        body["error"]["type"] = "authentication_error"
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": payload})
