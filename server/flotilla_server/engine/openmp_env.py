"""OpenMP's settings for CPU engines, set in the environment before torch loads OpenMP (torch-free).

Why each default (docs/serving.md, "CPU threads"):
- `OMP_WAIT_POLICY=PASSIVE`: threads that spin while waiting for work burn the CPU that co-tenants, the
  pod's CPU quota or the HTTP loop need; on a shared 2-core box a 64-sequence decode step took 0.6-0.9 s
  spinning against ~9 ms passive;
- `GOMP_SPINCOUNT=10000` (about 0.3 ms of spinning on the development machine) on top of it: with no spin
  at all, a thread sleeps between any two parallel regions and each of a step's ~300 operators waits to
  wake it; a two-thread one-row decode step of llama-100m then ran at half the speed of one thread (9
  against 19 tokens/s), and at 3-30 k spins at 1.5-1.7x it. The spin outlasts the gaps inside a step, not
  the gaps between steps, so idle engines still sleep;
- `OMP_NUM_THREADS`, the server only: the usable CPUs (the cores it may run on, capped by the container's
  CPU quota: engine/cpu_quota.py) less one, at least 1, leaving a core to the event loop that serves HTTP
  and SSE (on 2 cores, torch on both gave 64 streaming clients 3.9 k output tokens/s, on one 5.1 k); steps
  of few rows may still borrow it (engine/step_threads.py), and one model's engine keeps fewer when a full
  decode step measured as fast on them (engine/thread_count.py).
Each is a default: a value already in the environment wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from flotilla_server.engine.cpu_quota import usable_cpus

SPIN_COUNT = 10_000


def set_openmp_defaults(environ: MutableMapping[str, str] = os.environ, *, leave_a_core: bool,
                        cpus: int | None = None) -> bool:
    """`cpus`: the usable CPUs (default: what engine/cpu_quota.py reads from this machine). True when the
    thread count is this default, which the engine may lower (engine/thread_count.py); False when the
    environment set it or `leave_a_core` is off."""
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
    if not leave_a_core or "OMP_NUM_THREADS" in environ:
        return False
    environ["OMP_NUM_THREADS"] = str(max(1, (usable_cpus() if cpus is None else cpus) - 1))
    return True
