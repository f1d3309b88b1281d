"""An emulator that requires a bearer token and rotates it, as a projected service-account token rotates.

The token lives in a file that the kubeconfig names (`tokenFile`), as the kubelet keeps a pod's token
in a file. `rotate()` writes a new token there and stops accepting the old one at once, so a client
that read its credentials once gets 401 from then on; one that logs in again on 401 keeps working.

    with serve(tmp_path, crds=[crd()], emulator=TokenEmulator.for_file(tmp_path / "token")) as k8s:
        ...
        k8s.emulator.rotate()
"""

from __future__ import annotations

import secrets
from pathlib import Path

import aiohttp.web
import attrs

from tests.support.k8s_apiserver import FlotillaEmulator
from tests.support.k8s_kinds import ApiError


@attrs.define(kw_only=True)
class TokenEmulator(FlotillaEmulator):
    token_file: Path
    token: str = ""
    unauthorized: int = 0  # 401s answered: proof that a rotation was felt
    authorized_after_rotation: int = 0  # requests with the newest token since the last rotation

    @classmethod
    def for_file(cls, token_file: Path) -> TokenEmulator:
        emulator = cls(token_file=token_file)
        emulator.rotate()
        emulator.authorized_after_rotation = 0
        return emulator

    def rotate(self) -> str:
        """A new token in the file; the old one is refused from now on."""
        self.token = secrets.token_urlsafe(16)
        self.token_file.write_text(self.token + "\n")
        self.authorized_after_rotation = 0
        return self.token

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.headers.get("Authorization") != f"Bearer {self.token}":
            self.unauthorized += 1
            error = ApiError(401, "Unauthorized", "the bearer token is missing, expired or rotated away")
            return aiohttp.web.json_response(error.status(), status=401)
        self.authorized_after_rotation += 1
        return await super().__call__(raw_request)
