"""Where the prefix-routing bench's tenants went: for the record, never to route (bench/prefix_routing.py).

`placements`: from the gateway's access log, which replicas served each tenant (the bench sends the tenant in
X-Flotilla-Tenant), the share of requests on their tenant's most-used replica, and how many tenants each
replica served most (the balance of the prompts the replicas must hold: two each fit in the bench's KV).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def placements(log: Path, offset: int, servers: list[str]) -> dict[str, Any]:
    """Requests per replica for each tenant, from the access log written after byte `offset`; the share of
    requests that went to their tenant's most-used replica (1.0: perfect affinity); tenants per replica, each
    counted on its most-used one."""
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
    main = [0] * len(servers)
    for counts in per_tenant.values():
        main[counts.index(max(counts))] += 1
    return {"tenant_requests_per_pod": dict(sorted(per_tenant.items())), "main_pod_tenants": main,
            "tenant_affinity": round(sum(max(c) for c in per_tenant.values()) / total, 3) if total else None}
