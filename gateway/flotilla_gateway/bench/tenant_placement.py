"""Where the prefix-routing bench's tenants went: for the record, never to route (bench/prefix_routing.py).

- `home_pods`: how many tenants the ring puts on each replica when all are idle, from the pure `choose`:
  the ring's balance for one run's prompts, which decides how many prompts each replica must hold;
- `placements`: from the gateway's access log, which replicas served each tenant (the bench sends the
  tenant in X-Flotilla-Tenant), and the share of requests on their tenant's most-used replica.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flotilla_gateway.routing import PodView, choose, routing_key


def home_pods(bodies: list[dict[str, Any]], model: str, endpoint: str, servers: list[str]) -> list[int]:
    """Tenants per replica, given one request body per tenant."""
    pods = [PodView(url.removeprefix("http://"), load_age_s=0.0) for url in servers]
    counts = [0] * len(servers)
    for body in bodies:
        chosen = choose(pods, routing_key(model, endpoint, body), "prefix")
        assert chosen is not None
        counts[pods.index(chosen)] += 1
    return counts


def placements(log: Path, offset: int, servers: list[str]) -> dict[str, Any]:
    """Requests per replica for each tenant, from the access log written after byte `offset`, and the share
    of requests that went to their tenant's most-used replica (1.0: perfect affinity)."""
    index = {url.removeprefix("http://"): i for i, url in enumerate(servers)}
    per_tenant: dict[str, list[int]] = {}
    with log.open("rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if entry.get("logger") == "flotilla_gateway.access" and entry.get("pod") in index:
                per_tenant.setdefault(entry["tenant"], [0] * len(servers))[index[entry["pod"]]] += 1
    total = sum(sum(c) for c in per_tenant.values())
    return {"tenant_requests_per_pod": dict(sorted(per_tenant.items())),
            "tenant_affinity": round(sum(max(c) for c in per_tenant.values()) / total, 3) if total else None}
