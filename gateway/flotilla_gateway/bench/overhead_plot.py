"""The gateway cost bench's plot: CPU per 1,000 chunks and latency added per arm (bench/overhead.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    arms = [a for a in dict.fromkeys(r["arm"] for r in runs) if a != "direct"]
    fig, (cpu, added) = plt.subplots(1, 2, figsize=(13, 4.5))
    for offset, mode in ((-0.2, "paced"), (0.2, "fast")):
        for i, arm in enumerate(arms):
            values = [r["cpu_s_per_1000_chunks"] * 1e3 for r in runs if r["mode"] == mode and r["arm"] == arm]
            cpu.scatter([i + offset] * len(values), values, color="C0" if mode == "paced" else "C1",
                        label=mode if i == 0 else None, s=14)
    cpu.set_xticks(range(len(arms)), arms, rotation=15)
    cpu.set(ylabel="gateway CPU ms per 1,000 chunks", title="CPU per 1,000 chunks (each round a dot)", ylim=(0, None))
    cpu.legend()
    direct = {r["round"]: r for r in runs if r["mode"] == "paced" and r["arm"] == "direct"}
    for offset, q in ((-0.2, "p50"), (0.2, "p99")):
        for i, arm in enumerate(arms):
            values = [r[f"age_{q}_ms"] - direct[r["round"]][f"age_{q}_ms"] for r in runs
                      if r["mode"] == "paced" and r["arm"] == arm]
            added.scatter([i + offset] * len(values), values, color="C2" if q == "p50" else "C3",
                          label=q if i == 0 else None, s=14)
    added.axhline(5, color="grey", linestyle="--")
    added.set_yscale("symlog", linthresh=1)  # a busy neighbour's rare 100 ms stall beside sub-ms medians
    added.set_xticks(range(len(arms)), arms, rotation=15)
    added.set(ylabel="ms added to a chunk's age (arm − direct)",
              title=f"latency added at {results['rate']:g} chunks/s ({results['streams']} streams)")
    added.legend()
    cpu_name = results["machine_before"]["cpu"]
    fig.suptitle(f"{cpu_name.get('Model name', cpu_name) if isinstance(cpu_name, dict) else cpu_name}, "
                 f"load average {results['machine_before']['load_average'][0]}; "
                 f"{results['request_chunks']} chunks per request")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
