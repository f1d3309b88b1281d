"""How many CPUs this process may use: the cores it may run on, capped by its container's CPU quota
(torch-free; read before torch loads, by engine/openmp_env.py).

Why: on Kubernetes a pod's CPU limit is a CFS quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
`cpu.cfs_period_us`), not an affinity mask: a pod limited to 4 CPUs on a 64-core node sees 64 cores in
`sched_getaffinity`. An engine that starts an OpenMP thread per core there runs 63 threads in 4 CPUs'
time; each operator's threads wait at a barrier for the slowest, and a thread whose quota ran out waits
for the next period (100 ms by default), so every step stalls. The operator sets the limit from
`resources.cpu` (operator/flotilla_operator/manifests.py).

Rules:
- a quota of Q CPU-seconds a second allows floor(Q) threads, at least 1: a thread beyond the quota only
  waits at the barriers;
- no quota ("max", -1, or no cgroup file), or one above the cores, leaves the cores;
- the first file that states a quota wins (v2, then v1).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def quota_cpus(v2_cpu_max: Path = CGROUP_V2_CPU_MAX,
               v1_quota: tuple[Path, Path] = CGROUP_V1_QUOTA) -> float | None:
    """The container's CPU quota in CPUs (2.5 for "250000 100000"); None when it has none."""
    try:
        fields = v2_cpu_max.read_text().split()
    except OSError:
        fields = []
    if len(fields) == 2 and fields[0] != "max":
        return _ratio(fields[0], fields[1])
    if not fields:
        try:
            return _ratio(v1_quota[0].read_text().strip(), v1_quota[1].read_text().strip())
        except OSError:
            return None
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cpus_allowed(cores: int, quota: float | None) -> int:
    """`cores` capped by a quota of `quota` CPUs (None: no quota); at least 1."""
    if quota is None:
        return max(1, cores)
    return max(1, min(cores, math.floor(quota)))


def usable_cpus() -> int:
    """The cores this process may run on, capped by its container's CPU quota."""
    return cpus_allowed(len(os.sched_getaffinity(0)), quota_cpus())
