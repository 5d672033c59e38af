"""Facts about the machine that the library needs to refuse work that cannot fit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def _core_ticks(cores: set[int]) -> dict[int, tuple[int, int]]:
    """Each of ``cores``' clock ticks since boot from /proc/stat (Linux): (all, idle + iowait).
    Raises OSError / ValueError / IndexError where it cannot be read."""
    out = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                ticks = [int(x) for x in fields[:8]]  # user .. steal (guest is in user)
                out[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
    return out


def _busy_between(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> float:
    """Cores kept busy between two ``_core_ticks``: each core's busy share, summed."""
    busy = 0.0
    for core, (total, idle) in before.items():
        d_total = after[core][0] - total
        if d_total > 0:
            busy += 1.0 - (after[core][1] - idle) / d_total
    return busy


def busy_cores(cores: set[int], interval: float = 0.2) -> float | None:
    """How many of ``cores`` other work keeps busy right now: the busy share of each core over
    ``interval`` seconds from /proc/stat (Linux), summed; None where it cannot be read. This
    process sleeps meanwhile, so it is not counted."""
    try:
        before = _core_ticks(cores)
        time.sleep(interval)
        after = _core_ticks(cores)
        return _busy_between(before, after) if before else None
    except (OSError, ValueError, IndexError, KeyError):
        return None


def allowed_cores() -> set[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0)) or {0}
    return set(range(os.cpu_count() or 1))


def cpu_threads(requested: int = 0) -> tuple[int, str]:
    """How many CPU threads PyTorch should use, and why (one line for stderr).

    ``requested`` > 0 is taken as it is. 0 picks the cores this process may run on minus the
    ones other work keeps busy, at least 1: on 2 cores with load 2.2, one MDR step took 46 ms
    on one thread and 153 ms on two, as the threads wait for each other behind the other work
    (docs/training.md). Busy cores are the smaller of the 1-minute load average and a 0.2 s
    sample of the cores' busy time: the load average lags (a job that ended a minute ago
    still counts), the sample alone could catch a short burst."""
    allowed = allowed_cores()
    cores = len(allowed)
    if requested > 0:
        return requested, f"{requested} CPU thread(s) (--threads)"
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return cores, f"{cores} CPU thread(s): {cores} core(s), load unknown"
    now = busy_cores(allowed)
    busy = load if now is None else min(load, now)
    free = max(1, min(cores, cores - int(busy + 0.5)))
    sampled = "" if now is None else f", busy now {now:.1f}"
    return free, (
        f"{free} CPU thread(s): {cores} core(s), load {load:.1f}{sampled} "
        "(--threads N to choose)"
    )


def _tree_cpu_seconds() -> float | None:
    """CPU seconds of this process (every thread), of the processes it started that still run
    (torch.compile's workers, their compilers: /proc/<pid>/task/<tid>/children, recursively)
    and of those already waited for (cutime, cstime). None where /proc cannot be read."""
    tick = os.sysconf("SC_CLK_TCK")
    ticks, todo, seen = 0, [os.getpid()], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after "pid (name)"
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError, IndexError):
            if pid == os.getpid():
                return None
    return ticks / tick


def thread_levels(cores: int) -> list[int]:
    """The thread counts a ``ThreadGovernor`` uses on ``cores`` cores: powers of two and the
    core count. Each count a compiled function meets is one more compiled version of it (and
    torch.compile keeps 8), so the counts stay few: 1, 2, 4, 8, 16, 32, 48 on 48 cores."""
    return sorted({cores, *(2**k for k in range(cores.bit_length()) if 2**k <= cores)})


#: seconds between a governor's looks at the machine
GOVERN_EVERY = 2.0


class ThreadGovernor:
    """Keeps PyTorch's CPU threads at the cores other work leaves free while a long job runs.

    ``cpu_threads`` decides once, at the start; work that starts later (or just before: the
    load average lags) then shares a core with one of our threads, and every parallel region
    waits for that thread's turn on the core. A MASS step on the embedded data took 52.9 ms on
    one thread and 2,504.6 ms on two with the second core busy (2 cores; docs/training.md,
    "Threads that follow the machine").

    ``poll`` is cheap and meant to be called often (every training step, every evaluation
    batch). Every ``every`` seconds it compares the allowed cores' busy time (/proc/stat) with
    this process's own CPU time, its child processes' included (``_tree_cpu_seconds``): the
    difference is other work. It drops threads at once when other work leaves it more than
    half a core short of one per thread, to the largest of ``thread_levels`` that fits, and
    goes up one level only when the cores for it stay free (all but 0.2 of a core) for ``2**k``
    windows in a row (k = the drops so far, at most 5), so a machine whose load comes and goes
    does not keep changing the count. It reads the count PyTorch has at each look (a count
    set elsewhere is followed). Threads only change on the thread that calls ``poll``
    (OpenMP's count is per calling thread). Where /proc cannot be read it does nothing."""

    def __init__(
        self,
        log: Callable[[str], None] | None = None,
        every: float | None = None,
        cores: set[int] | None = None,
    ) -> None:
        every = GOVERN_EVERY if every is None else every
        self.cores = allowed_cores() if cores is None else cores
        self.levels = thread_levels(len(self.cores))
        self.log = log
        self.every = every
        self._drops = 0
        self._free_windows = 0
        self._mark = self._sample()
        self._due = time.monotonic() + every

    def _sample(self) -> tuple[float, float, dict[int, tuple[int, int]]] | None:
        try:
            ticks = _core_ticks(self.cores)
        except (OSError, ValueError, IndexError):
            return None
        own = _tree_cpu_seconds()
        return None if own is None else (time.monotonic(), own, ticks)

    @property
    def threads(self) -> int:
        """PyTorch's thread count now (the governor's last change, or a count set elsewhere)."""
        import torch

        return torch.get_num_threads()

    @staticmethod
    def others(before: tuple, after: tuple) -> float:
        """Cores that other work kept busy between two samples."""
        wall = after[0] - before[0]
        own = (after[1] - before[1]) / wall if wall > 0 else 0.0
        return max(0.0, _busy_between(before[2], after[2]) - own)

    def poll(self) -> None:
        """Change the thread count if the last window says so (see the class)."""
        if time.monotonic() < self._due or self._mark is None:
            return
        sample = self._sample()
        if sample is None or not sample[2]:
            self._mark = None  # /proc went away: stop governing
            return
        try:
            others = self.others(self._mark, sample)
        except KeyError:  # a core left the set: start a new window
            others = None
        self._mark, self._due = sample, sample[0] + self.every
        if others is None:
            return
        now = self.threads
        room = len(self.cores) - others  # cores left for this process
        higher = [n for n in self.levels if n > now]
        if now > 1 and room < now - 0.5:
            fits = max(1, int(room + 0.5))
            self._set(now, max(n for n in self.levels if n <= min(fits, now - 1)), others)
            self._drops = min(self._drops + 1, 5)
            self._free_windows = 0
        elif higher and room >= higher[0] - 0.2:
            self._free_windows += 1
            if self._free_windows >= 2**self._drops:
                self._set(now, higher[0], others)
                self._free_windows = 0
        else:
            self._free_windows = 0

    def _set(self, now: int, threads: int, others: float) -> None:
        import torch

        torch.set_num_threads(threads)
        if self.log is not None:
            self.log(
                f"CPU threads {now} -> {threads}: other work keeps {others:.1f} of "
                f"{len(self.cores)} core(s) busy"
            )


_governor: ThreadGovernor | None = None


@contextmanager
def governed_threads(
    log: Callable[[str], None] | None = None, every: float | None = None
) -> Iterator[ThreadGovernor]:
    """Within this block, ``poll_threads`` (called by training and evaluation loops) keeps the
    thread count PyTorch uses at the free cores (``ThreadGovernor``), starting from the count
    it has. The thread count is the process's, so there is one governor at a time; the count
    it set last stays when the block ends."""
    global _governor
    outer = _governor
    _governor = ThreadGovernor(log, every)
    try:
        yield _governor
    finally:
        _governor = outer


def poll_threads() -> None:
    """Let the active ``governed_threads`` block check the thread count; nothing without one."""
    if _governor is not None:
        _governor.poll()


#: PyTorch's own switch (its CPU allocator, torch >= 2.2): tensors of 2 MB and more get memory
#: aligned to and advised as transparent huge pages
THP_SWITCH = "THP_MEM_ALLOC_ENABLE"
_THP_SYSFS = "/sys/kernel/mm/transparent_hugepage/enabled"


def tensor_huge_pages() -> bool:
    """Ask PyTorch to back large CPU tensors with transparent huge pages; True when that takes
    effect (Linux, the kernel's THP not "never", set before PyTorch allocated anything, i.e.
    before ``import torch``).

    A training step on a CPU allocates and frees the same tens-of-MB tensors every time, and the
    C library maps each afresh from the kernel: with 4 KB pages every page faults and is zeroed
    again (1.6M page faults in 40 MASS steps on AOTM-2011; 0.47M with 2 MB pages). A MASS epoch
    on AOTM (2 cores, compiled) 105.0 -> 97.9 s, the same peak memory; the first steps of a
    process gain most, before glibc raises its mapping threshold (docs/training.md).
    Process-wide, so the CLI calls it once, before importing PyTorch; a library user may set
    ``THP_MEM_ALLOC_ENABLE=1`` in the environment instead. A value the user set
    (``THP_MEM_ALLOC_ENABLE=0`` to opt out) is kept."""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(_THP_SYSFS) as fh:
            if "[never]" in fh.read():
                return False
    except OSError:
        return False
    if "torch" in sys.modules:  # PyTorch read the switch at its first allocation
        return os.environ.get(THP_SWITCH) == "1"
    return os.environ.setdefault(THP_SWITCH, "1") == "1"


#: opt-out of ``keep_freed_heap`` ("0"); glibc's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_
#: in the environment also leave the C library's settings as the user chose them
HEAP_SWITCH = "MASR_KEEP_HEAP"
#: blocks below this come from the heap and are reused after they are freed
HEAP_MMAP_THRESHOLD = 256 * 2**20
#: free memory at the top of the heap is given back to the system only above this
HEAP_TRIM_THRESHOLD = 1 * 2**30
_GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def keep_freed_heap() -> bool:
    """Let glibc serve CPU tensors of up to 256 MiB from its heap and reuse them once freed;
    True when that took effect (Linux with glibc, not opted out).

    A training step allocates and frees the same tens-of-MB tensors every time (MASS's (batch,
    negatives, d) queries are 32 MiB at batch 1024 and 128 negatives). glibc maps every block
    above its mapping threshold (at most 32 MiB by default) afresh from the kernel and unmaps it
    when freed, so each step faults in and zeroes those pages again, huge pages or not
    (``tensor_huge_pages``). A fixed threshold of 256 MiB and a trim threshold of 1 GiB keep
    such blocks in the heap, where later steps reuse them when glibc's placement allows (not
    every time); nothing computed changes. The cost: up to 1 GiB
    of freed memory may stay with the process until it ends (docs/training.md). Opt out with
    ``MASR_KEEP_HEAP=0``, or set glibc's own ``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_``, which are kept. Process-wide: the CLI calls it once at start."""
    import sys

    if not sys.platform.startswith("linux") or os.environ.get(HEAP_SWITCH, "1") == "0":
        return False
    if any(name in os.environ for name in _GLIBC_ENV):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD)
    )
