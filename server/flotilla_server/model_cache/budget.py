"""The default memory budget of a multi-model server: a share of the device it runs on.

On a GPU, 80% of its memory, leaving room for the CUDA context, activations and the allocator's slack.
On CPU, half the memory the process may use (the container's cgroup limit, else the machine's RAM), so
the HTTP side, tokenizers and a load in flight keep room. `--memory-budget` overrides both
(docs/serving.md, "Multi-model mode").
"""

from __future__ import annotations

import os
from pathlib import Path

GPU_SHARE = 0.8
CPU_SHARE = 0.5


def share(total_bytes: int, device: str) -> int:
    return int(total_bytes * (GPU_SHARE if device.startswith("cuda") else CPU_SHARE))


def cpu_memory_bytes() -> int:
    """The cgroup v2 limit if one is set, else physical RAM."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return ram
    return min(ram, int(limit)) if limit.isdigit() else ram


def default_budget_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        return share(torch.cuda.get_device_properties(index).total_memory, device)
    return share(cpu_memory_bytes(), device)
