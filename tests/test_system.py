"""Machine facts: the automatic CPU thread count (masr.system.cpu_threads)."""

from __future__ import annotations

import os

import pytest

import masr.system
from masr.system import busy_cores, cpu_threads


@pytest.mark.parametrize(
    ("load", "now", "want"),
    [
        (0.0, None, 4),
        (1.4, None, 3),
        (2.6, None, 1),
        (9.0, None, 1),
        (1.6, 0.1, 4),  # the load average still counts work that has ended
        (0.2, 3.0, 4),  # a burst in the sample alone does not take the cores
        (2.9, 2.7, 1),  # busy by both measures
    ],
)
def test_auto_threads_leave_the_busy_cores(
    monkeypatch, load: float, now: float | None, want: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(masr.system, "busy_cores", lambda cores: now)
    n, why = cpu_threads(0)
    assert n == want and f"{want} CPU thread" in why and "4 core" in why


def test_busy_cores_reads_this_machine() -> None:
    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else {0}
    busy = busy_cores(cores, interval=0.05)
    if busy is None:
        pytest.skip("no /proc/stat here")
    assert 0.0 <= busy <= len(cores) + 1e-9


def test_explicit_threads_are_kept() -> None:
    assert cpu_threads(3)[0] == 3
