"""Machine facts: the automatic CPU thread count (masr.system.cpu_threads)."""

from __future__ import annotations

import os

import pytest

from masr.system import cpu_threads


@pytest.mark.parametrize(("load", "want"), [(0.0, 4), (1.4, 3), (2.6, 1), (9.0, 1)])
def test_auto_threads_leave_the_busy_cores(monkeypatch, load: float, want: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    n, why = cpu_threads(0)
    assert n == want and f"{want} CPU thread" in why and "4 core" in why


def test_explicit_threads_are_kept() -> None:
    assert cpu_threads(3)[0] == 3
