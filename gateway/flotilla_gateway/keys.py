"""Optional API keys: who may call, and which models they may use.

The keys file (a mounted Secret) maps each key to a tenant and its models, as YAML or JSON:

    sk-team-a-123: {tenant: team-a, models: [llama-8b, tiny]}
    sk-ops-456: {tenant: ops}            # no models: every model
    sk-evals-789: {tenant: evals, class: batch}   # every request of this key is batch work

A missing or unknown key is 401, a model outside the tenant's list 403, both in OpenAI's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from flotilla_contract.classes import REQUEST_CLASSES

from flotilla_gateway.errors import GatewayError


@dataclass(frozen=True)
class Tenant:
    name: str
    models: frozenset[str] | None  # None: every model
    request_class: str | None = None  # the class every request of the key gets; None: the client's


def load_keys(path: str | Path) -> dict[str, Tenant]:
    """key → Tenant from the keys file; ValueError that says what to fix."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the keys file {path}: {error}") from error
    if not isinstance(data, dict) or not data:
        raise ValueError(f"the keys file {path} must map each key to {{tenant: NAME, models: [...]}}")
    keys = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"]:
            raise ValueError(f"the keys file {path}: the entry of key {str(key)[:4]}… needs a `tenant` name")
        models = entry.get("models")
        if models is not None and not (isinstance(models, list) and all(isinstance(m, str) for m in models)):
            raise ValueError(f"the keys file {path}: `models` of tenant {entry['tenant']!r} must be a list of names")
        request_class = entry.get("class")
        if request_class is not None and request_class not in REQUEST_CLASSES:
            raise ValueError(f"the keys file {path}: `class` of tenant {entry['tenant']!r} must be one of "
                             f"{', '.join(REQUEST_CLASSES)}, got {request_class!r}")
        keys[str(key)] = Tenant(entry["tenant"], frozenset(models) if models is not None else None, request_class)
    return keys


def read_upstream_key(path: str) -> str:
    """The servers' key (flotilla-server --api-key) from a mounted Secret's file, surrounding whitespace dropped."""
    try:
        key = Path(path).read_text().strip()
    except OSError as error:
        raise ValueError(f"cannot read the upstream key file {path}: {error}") from error
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"the upstream key file {path} must hold one key (no spaces), the servers' --api-key")
    return key


def authenticate(keys: dict[str, Tenant], authorization: str | None) -> Tenant:
    """The tenant of the request's `Authorization: Bearer KEY`, or GatewayError 401."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise GatewayError(401, "Missing API key: send it as 'Authorization: Bearer <key>' "
                                "(the OpenAI SDK's api_key).", code="invalid_api_key")
    tenant = keys.get(key.strip())
    if tenant is None:
        raise GatewayError(401, "Incorrect API key: check the key you were given.", code="invalid_api_key")
    return tenant


def authorize(tenant: Tenant, model: str) -> None:
    """GatewayError 403 unless `tenant` may use `model`."""
    if tenant.models is not None and model not in tenant.models:
        allowed = ", ".join(sorted(tenant.models)) or "none"
        raise GatewayError(403, f"The tenant {tenant.name!r} may not use the model {model!r}: "
                                f"its key allows {allowed}.", param="model", code="model_not_allowed")
