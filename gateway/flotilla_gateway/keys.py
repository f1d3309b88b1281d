"""Optional API keys: who may call, and which models they may use.

The keys file (a mounted Secret) maps each key to a tenant and its models, as YAML or JSON:

    sk-team-a-123: {tenant: team-a, models: [llama-8b, tiny]}
    sk-ops-456: {tenant: ops, models: ["*"]}                  # every model, written out
    sk-evals-789: {tenant: evals, models: [tiny], class: batch}   # every request of this key is batch work
    sk-trial-012: {tenant: trial, models: [tiny], requestsPerMinute: 60, tokensPerMinute: 20000}

A key may carry rate limits beside its models (rate_limit.py); a key without them is not limited.

It is a security file, so it is parsed strictly: a typo must never widen access. An unknown field (`model:`
for `models:`), a wrong type, an empty entry, a missing `models`, or a key written twice refuses the whole
file, with one line that says what to change. Every model is granted only by `models: ["*"]`, alone.

A missing or unknown key is 401, a model outside the tenant's list 403, both in OpenAI's error shape.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from flotilla_contract.classes import REQUEST_CLASSES

from flotilla_gateway.errors import GatewayError
from flotilla_gateway.rate_limit import NO_LIMIT, RateLimit

EVERY_MODEL = "*"  # valid only as the whole list: models: ["*"]
LIMIT_FIELDS = ("requestsPerMinute", "tokensPerMinute")  # in RateLimit's order
FIELDS = ("tenant", "models", "class", *LIMIT_FIELDS)
ENTRY_FORM = "{tenant: NAME, models: [MODEL, ...]} (models: [\"*\"] for every model)"


@dataclass(frozen=True)
class Tenant:
    name: str
    models: frozenset[str]  # the models the key may use; {"*"}: every model; empty: none
    request_class: str | None = None  # the class every request of the key gets; None: the client's
    limits: RateLimit = NO_LIMIT  # requestsPerMinute and tokensPerMinute; None each: not limited
    key: str = field(default="", repr=False, compare=False)  # the API key: names its rate-limit buckets; never shown


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key written twice in one mapping (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _shown(key: object) -> str:
    """A key as error messages name it: its first four characters only, for it is a secret."""
    return f"{str(key)[:4]}…"


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's complaint without the line it quotes, which may hold a key."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())
    mark = error.problem_mark or error.context_mark
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join(" ".join(p for p in (error.context, error.problem) if p).split()) + at


def read_keys_file(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the keys file {path}: {error.strerror or error}: "
                         "check --api-keys-file and the Secret's mount") from error


def parse_keys(content: bytes, source: str) -> dict[str, Tenant]:
    """key → Tenant from the keys file's bytes; ValueError, one line naming what to change, for anything
    but the exact schema (`source` names the file in it)."""
    where = f"the keys file {source}"
    try:
        data = yaml.load(content.decode(), Loader=_StrictLoader)
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not UTF-8 text ({error.reason} at byte {error.start})") from error
    except _DuplicateKey as error:
        what = f"the field `{error.key}`" if error.key in FIELDS else f"the key {_shown(error.key)}"
        raise ValueError(f"{where}: {what} is written twice (line {error.line}): keep one") from error
    except yaml.YAMLError as error:
        raise ValueError(f"{where} is not valid YAML: {_yaml_problem(error)}") from error
    if not data:
        raise ValueError(f"{where} is empty: map each API key to {ENTRY_FORM}")
    if not isinstance(data, dict):
        raise ValueError(f"{where} must map each API key to {ENTRY_FORM}, not be a {type(data).__name__}")
    return {key: _tenant(key, entry, where) for key, entry in data.items()}


def load_keys(path: str | Path) -> dict[str, Tenant]:
    """key → Tenant from the keys file at `path`; ValueError that says what to fix."""
    return parse_keys(read_keys_file(path), str(path))


def _tenant(key: object, entry: object, where: str) -> Tenant:
    if not isinstance(key, str):
        raise ValueError(f"{where}: a key is not text (YAML reads it as {type(key).__name__}): quote it")
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"{where}: the key {_shown(key)!r} is empty or holds a space: a key is one word")
    at = f"{where}: key {_shown(key)}"
    if entry is None or entry == {}:
        raise ValueError(f"{at} has an empty entry: write {ENTRY_FORM}, or delete the key")
    if not isinstance(entry, dict):
        raise ValueError(f"{at}: the entry must be {ENTRY_FORM}, not a {type(entry).__name__}")
    for name in entry:
        if name not in FIELDS:
            close = difflib.get_close_matches(str(name), FIELDS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ValueError(f"{at}: unknown field `{name}`{hint}; the fields are tenant, models, class, "
                             "requestsPerMinute and tokensPerMinute")
    tenant = entry.get("tenant")
    if not isinstance(tenant, str) or not tenant.strip():
        raise ValueError(f"{at}: `tenant` must be a name (text), got {tenant!r}")
    at = f"{at} (tenant {tenant!r})"
    if "models" not in entry:
        raise ValueError(f"{at} has no `models`: list the models it may use, or write models: [\"*\"] for "
                         "every model")
    models = entry["models"]
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"{at}: `models` must be a list of model names, e.g. [tiny], or [\"*\"] for every "
                         f"model; got {models!r}")
    if EVERY_MODEL in models and len(set(models)) > 1:
        raise ValueError(f"{at}: `models` mixes \"*\" with names: write [\"*\"] alone for every model, or "
                         "the names alone")
    patterns = [m for m in models if EVERY_MODEL in m and m != EVERY_MODEL]
    if patterns:
        raise ValueError(f"{at}: `models` names {patterns[0]!r}, but names are not patterns: list each model, "
                         "or write [\"*\"] alone for every model")
    request_class = entry.get("class")
    if "class" in entry and request_class not in REQUEST_CLASSES:
        raise ValueError(f"{at}: `class` must be one of {', '.join(REQUEST_CLASSES)}, got {request_class!r}")
    limits = RateLimit(*(_limit(entry, name, at) for name in LIMIT_FIELDS))
    return Tenant(tenant, frozenset(models), request_class, limits, key)


def _limit(entry: dict[Any, Any], name: str, at: str) -> int | None:
    """A per-minute limit: a whole number above 0, or absent (no limit). 0 is refused: a key that may send
    nothing is written models: []."""
    if name not in entry:
        return None
    value = entry[name]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{at}: `{name}` must be a whole number above 0 (leave it out for no limit), got "
                         f"{value!r}")
    return value


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
    if EVERY_MODEL not in tenant.models and model not in tenant.models:
        allowed = ", ".join(sorted(tenant.models)) or "none"
        raise GatewayError(403, f"The tenant {tenant.name!r} may not use the model {model!r}: "
                                f"its key allows {allowed}.", param="model", code="model_not_allowed")
