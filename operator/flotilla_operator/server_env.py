"""The server container's environment: its writable paths, and the API key from a Secret.

The key reaches flotilla-server as the variable named after `--api-key` in the contract's flag table
(FLOTILLA_API_KEY), filled by the kubelet from the Secret that `spec.server.apiKeySecretRef` names. A flag
would put the key itself in the pod spec and the process list; this way the pod spec shows only the
Secret's name. The reference is not optional: a missing Secret or key stops the pod at
CreateContainerConfigError (the model turns Degraded, pod_health.py), rather than serving without a key.
"""

from __future__ import annotations

from typing import Any

from flotilla_contract.flags import FLAGS_BY_NAME

from flotilla_operator.types import ServerSpec

API_KEY_ENV = FLAGS_BY_NAME["--api-key"].env
WRITABLE_PATHS = (("HOME", "/tmp"), ("HF_HOME", "/tmp/hf"))  # the root filesystem is read-only


def server_env(server: ServerSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in WRITABLE_PATHS]
    if (ref := server.api_key_secret_ref) is not None:
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env
