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
