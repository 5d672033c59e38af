"""Facts about the machine that the library needs to refuse work that cannot fit."""

from __future__ import annotations

import os
from typing import Any


def available_memory(device: Any) -> int:
    """Bytes free for one large allocation on ``device`` (a torch.device; GPU: free memory,
    CPU: MemAvailable). Unknown platforms answer "unlimited" so that nothing is refused."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 2**63 - 1


def cpu_threads(requested: int = 0) -> tuple[int, str]:
    """How many CPU threads PyTorch should use, and why (one line for stderr).

    ``requested`` > 0 is taken as it is. 0 picks the cores this process may run on minus the
    ones other work keeps busy (the 1-minute load average), at least 1: on 2 cores with load
    2.2, one MDR step took 46 ms on one thread and 153 ms on two, as the threads wait for each
    other behind the other work (docs/training.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if requested > 0:
        return requested, f"{requested} CPU thread(s) (--threads)"
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return cores, f"{cores} CPU thread(s): {cores} core(s), load unknown"
    free = max(1, min(cores, cores - int(load + 0.5)))
    return free, (
        f"{free} CPU thread(s): {cores} core(s), load {load:.1f} "
        "(--threads N to choose)"
    )
