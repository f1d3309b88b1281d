"""What a real API server does to built-in objects on every write: defaults and canonical quantities.

A client that compares what it sent with what it reads back sees these changes on a real cluster
(`cpu: 0.5` comes back as `500m`, `memory: 1.5Gi` as `1536Mi`, a Deployment gains a strategy and a
revisionHistoryLimit). The emulator applies them so that drift checks in tests see what a cluster
returns. The rules follow Kubernetes' `pkg/apis/*/v1/defaults.go` and `resource.Quantity`; only the
kinds the operator writes or reads (Deployment, Pod, Service) are covered.
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import re
from decimal import Decimal
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/12")
_cluster_ips = (str(ip) for ip in itertools.islice(_SERVICE_RANGE.hosts(), 10, None))
PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def canonical_quantity(text: str | int | float) -> str:
    """A quantity as the API server stores it: `0.5` → `500m`, `1.5Gi` → `1536Mi`, `1000` → `1k`."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"quantities must match the regular expression '{_QUANTITY.pattern}'")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        value = number * 1024 ** _BINARY[suffix]
        if value == value.to_integral_value():  # binary stays binary while it is a whole number of bytes
            for name, power in sorted(_BINARY.items(), key=lambda item: -item[1]):
                if value % 1024 ** power == 0 and value != 0:
                    return f"{int(value // 1024 ** power)}{name}"
            return str(int(value))
    elif suffix[:1] in ("e", "E"):
        value = number * Decimal(10) ** int(suffix[1:])
    else:
        value = number * Decimal(10) ** _DECIMAL[suffix]
    value = (value * 10 ** 9).to_integral_value(rounding="ROUND_CEILING") / Decimal(10 ** 9)  # nano precision
    if value == 0:
        return "0"
    for exponent in sorted(_DECIMAL_SUFFIX, reverse=True):  # the largest suffix with a whole mantissa
        mantissa = value / Decimal(10) ** exponent
        if mantissa == mantissa.to_integral_value():
            return f"{int(mantissa)}{_DECIMAL_SUFFIX[exponent]}"
    raise AssertionError("unreachable: nano precision always gives a whole mantissa")


def _quantities(amounts: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if amounts is None else {k: canonical_quantity(v) for k, v in amounts.items()}


def _container(container: dict[str, Any]) -> None:
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    for part in ("limits", "requests"):
        if part in resources:
            resources[part] = _quantities(resources[part])
    if "limits" in resources and "requests" not in resources:
        resources["requests"] = dict(resources["limits"])
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if probe is not None:
            for key, value in PROBE_DEFAULTS.items():
                probe.setdefault(key, value)
            if "httpGet" in probe:
                probe["httpGet"].setdefault("scheme", "HTTP")
    for env in container.get("env") or []:
        field_ref = (env.get("valueFrom") or {}).get("fieldRef")
        if field_ref is not None:
            field_ref.setdefault("apiVersion", "v1")


def pod_spec(spec: dict[str, Any]) -> None:
    """Defaults of a PodSpec, in place (a Pod's spec and a Deployment's template alike)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        _container(container)
    for volume in spec.get("volumes") or []:
        for source in ("secret", "configMap"):
            if source in volume:
                volume[source].setdefault("defaultMode", 0o644)
        empty_dir = volume.get("emptyDir")
        if empty_dir is not None and "sizeLimit" in empty_dir:
            empty_dir["sizeLimit"] = canonical_quantity(empty_dir["sizeLimit"])


def deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy.setdefault("type", "RollingUpdate")
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")
    template = spec.setdefault("template", {})
    template.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    pod_spec(template.setdefault("spec", {}))


def service(obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec.get("clusterIP") != "None":
        allocated = (old or {}).get("spec", {}).get("clusterIP")
        spec.setdefault("clusterIP", allocated or next(_cluster_ips))
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))


def apply_defaults(kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    """`obj` as the API server would store it (a copy); `old` is the stored version on an update."""
    obj = copy.deepcopy(obj)
    if kind == "Deployment":
        deployment(obj)
    elif kind == "Pod":
        pod_spec(obj.setdefault("spec", {}))
    elif kind == "Service":
        service(obj, old)
    return obj
