"""Machine facts: the automatic CPU thread count (masr.system.cpu_threads)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import masr.system
from masr.system import busy_cores, cpu_threads, governed_threads, poll_threads


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


_FAULTS_OF_A_BLOCK = """
import resource
from masr.system import tensor_huge_pages
made = tensor_huge_pages()
import torch
faults = []
for _ in range(3):  # every 64 MiB block is mapped afresh and freed: fault counts per block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(1 << 24)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del block
print(int(made), min(faults))
"""


def _snippet(script: str, env: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python (these switches act before PyTorch's first allocation)
    with ``env`` over this environment (None removes a variable)."""
    return subprocess.run(
        [sys.executable, "-c", script],
        env={k: v for k, v in {**os.environ, **env}.items() if v is not None},
        capture_output=True,
        text=True,
    )


def _block_faults(env: dict[str, str | None]) -> tuple[bool, int]:
    out = _snippet(_FAULTS_OF_A_BLOCK, env)
    out.check_returncode()
    made, faults = out.stdout.split()
    return bool(int(made)), int(faults)


def test_large_tensors_take_huge_pages_unless_the_user_says_no() -> None:
    try:
        with open(masr.system._THP_SYSFS) as fh:
            mode = fh.read()
    except OSError:
        pytest.skip("no transparent huge pages here")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off in this kernel")
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    made, faults = _block_faults({masr.system.THP_SWITCH: None})
    if not made:
        pytest.skip("not Linux")
    assert faults < pages // 20  # 2 MB pages: 32 faults for 64 MiB instead of 16,384
    made, faults = _block_faults({masr.system.THP_SWITCH: "0"})  # the user's choice is kept
    # (a kernel in "always" mode gives huge pages to every process: only "madvise" tells)
    assert not made and ("[madvise]" not in mode or faults > pages // 2)


_WHERE_A_BLOCK_LIVES = """
import ctypes, ctypes.util
from masr.system import keep_freed_heap
kept = keep_freed_heap()
import torch

class Info(ctypes.Structure):  # glibc's struct mallinfo2 (glibc >= 2.33)
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblkhd  # bytes in blocks mapped apart from the heap
block = torch.ones(100 << 18)  # 100 MiB, a training step's large tensor
print(int(kept), libc.mallinfo2().hblkhd - before)
"""


def _mapped_bytes_of_a_block(env: dict[str, str | None]) -> tuple[bool, int]:
    out = _snippet(_WHERE_A_BLOCK_LIVES, {masr.system.THP_SWITCH: "0", **env})
    if out.returncode:
        pytest.skip(f"no glibc mallinfo2 here: {out.stderr.strip().splitlines()[-1:]}")
    kept, mapped = out.stdout.split()
    return bool(int(kept)), int(mapped)


def test_large_tensors_come_from_the_heap_unless_the_user_says_no() -> None:
    """keep_freed_heap: a 100 MiB tensor is served by glibc's heap, where a freed block is kept
    for the next step, instead of being mapped afresh (glibc's default above 32 MiB);
    MASR_KEEP_HEAP=0, or glibc's own MALLOC_MMAP_THRESHOLD_, leaves glibc's default."""
    kept, mapped = _mapped_bytes_of_a_block({masr.system.HEAP_SWITCH: None})
    if not kept:
        pytest.skip("not Linux with glibc")
    assert mapped == 0
    for opt_out in ({masr.system.HEAP_SWITCH: "0"}, {"MALLOC_MMAP_THRESHOLD_": "131072"}):
        kept, mapped = _mapped_bytes_of_a_block({masr.system.HEAP_SWITCH: None, **opt_out})
        assert not kept and mapped >= 100 << 20


def test_every_torch_command_says_its_automatic_thread_count(tmp_path) -> None:
    """train (a closed-form fit too: no training phase), evaluate and reproduce take --threads;
    without it they say the count they chose on stderr, with it they say nothing of it."""
    import torch
    from conftest import write_planted
    from typer.testing import CliRunner

    from masr_cli.main import app

    runner = CliRunner()
    threads = torch.get_num_threads()
    data = write_planted(tmp_path / "data")
    runs = ["--data", str(data), "--runs", str(tmp_path / "runs")]
    try:
        for args in (["train", "--model", "pop", *runs], ["evaluate", *runs]):
            said = runner.invoke(app, args)
            assert said.exit_code == 0, (said.stderr, said.exception)
            assert "CPU thread(s)" in said.stderr.splitlines()[0]
            quiet = runner.invoke(app, [*args, "--threads", "1"])
            assert quiet.exit_code == 0 and "CPU thread(s)" not in quiet.stderr
            assert torch.get_num_threads() == 1
        bad = runner.invoke(app, ["reproduce", "--data", str(data), "--threads", "-1"])
        assert bad.exit_code == 1 and bad.stderr.startswith("masr: error: --threads")
    finally:
        torch.set_num_threads(threads)


def test_sigterm_unwinds_like_ctrl_c_and_exits_143() -> None:
    """`kill`, `timeout` and schedulers send SIGTERM: the command unwinds (finally blocks run:
    locks released, temporary files removed, runs marked interrupted) and exits with 143."""
    import signal
    import time

    import typer

    from masr_cli._common import handle_errors

    cleaned = []

    @handle_errors
    def work() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(typer.Exit) as info:
            work()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert info.value.exit_code == 143 and cleaned == [True]


class _Machine:
    """Scripted /proc/stat and CPU time of this process tree for ThreadGovernor: each
    ``second`` advances the clock by ``seconds`` (default 1), in which the ``cores`` cores
    are busy ``busy`` cores' worth and this process used ``own`` cores' worth."""

    def __init__(self, monkeypatch, busy: float, own: float, cores: int = 2,
                 seconds: float = 1.0) -> None:
        self.busy, self.own, self.n, self.seconds = busy, own, cores, seconds
        self.t, self.cpu = 0.0, 0.0
        self.ticks = {c: [0, 0] for c in range(cores)}
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)),
                            raising=False)
        monkeypatch.setattr(masr.system, "_core_ticks", self.look)
        monkeypatch.setattr(masr.system.time, "monotonic", lambda: self.t)
        monkeypatch.setattr(masr.system, "_tree_cpu_seconds", lambda: self.cpu)

    def look(self, cores: set[int]) -> dict[int, tuple[int, int]]:
        return {c: (total, idle) for c, (total, idle) in self.ticks.items() if c in cores}

    def second(self) -> None:
        self.t += self.seconds
        self.cpu += self.own * self.seconds
        for tick in self.ticks.values():  # the busy share spread evenly over the cores
            tick[0] += round(100 * self.seconds)
            tick[1] += round(100 * self.seconds * (1 - self.busy / self.n))


@pytest.fixture
def torch_threads():
    import torch

    threads = torch.get_num_threads()
    yield torch
    torch.set_num_threads(threads)


def test_governor_leaves_a_core_that_other_work_takes_and_comes_back(
    monkeypatch, torch_threads
) -> None:
    machine = _Machine(monkeypatch, busy=2.0, own=1.0)  # our 2 threads get 1 core: 1 is taken
    said: list[str] = []
    torch_threads.set_num_threads(2)
    with governed_threads(said.append, every=1.0) as governor:
        poll_threads()  # not a second yet: nothing looked at
        assert governor.threads == 2 and not said
        machine.second()
        poll_threads()
        assert governor.threads == 1 and torch_threads.get_num_threads() == 1
        assert said == ["CPU threads 2 -> 1: other work keeps 1.0 of 2 core(s) busy"]
        machine.busy = 1.0  # the other work ended; our one thread keeps one core busy
        machine.second()
        poll_threads()
        assert governor.threads == 1  # after a drop, two free windows in a row before a raise
        machine.second()
        poll_threads()
        assert governor.threads == 2 and torch_threads.get_num_threads() == 2
        assert said[-1] == "CPU threads 1 -> 2: other work keeps 0.0 of 2 core(s) busy"
    assert masr.system._governor is None


@pytest.mark.parametrize(
    ("threads", "busy", "own", "want"),
    [
        (2, 2.0, 2.0, 2),  # both cores are ours
        (2, 2.0, 1.6, 2),  # 0.4 of a core elsewhere: not worth a thread
        (2, 2.0, 1.4, 1),  # 0.6 of a core elsewhere
        (1, 2.0, 1.0, 1),  # one core ours, one taken
        (1, 1.3, 1.0, 1),  # a core 70% free is not free enough to add a thread
    ],
)
def test_governor_counts_only_other_work(
    monkeypatch, torch_threads, threads: int, busy: float, own: float, want: int
) -> None:
    machine = _Machine(monkeypatch, busy=busy, own=own)
    torch_threads.set_num_threads(threads)
    with governed_threads(every=1.0) as governor:
        for _ in range(3):
            machine.second()
            poll_threads()
        assert governor.threads == want


def test_governor_does_nothing_without_proc_stat(monkeypatch, torch_threads) -> None:
    def unreadable(cores: set[int]) -> dict:
        raise OSError("no /proc/stat")

    monkeypatch.setattr(masr.system, "_core_ticks", unreadable)
    torch_threads.set_num_threads(2)
    with governed_threads(every=0.0) as governor:
        poll_threads()
        assert governor.threads == 2 and torch_threads.get_num_threads() == 2
    poll_threads()  # no governor: nothing


def test_train_and_evaluate_leave_cores_other_work_takes(
    monkeypatch, torch_threads, tmp_path
) -> None:
    """--threads 0 (the default) on a machine whose cores other work takes after the start: the
    training and evaluation loops drop to one thread and say so; --threads N is left alone."""
    from conftest import write_planted
    from typer.testing import CliRunner

    from masr_cli.main import app

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(masr.system, "busy_cores", lambda cores: 0.0)  # free at the start
    monkeypatch.setattr(masr.system, "GOVERN_EVERY", 0.0)
    clock = [0]

    def busy_ticks(cores: set[int]) -> dict[int, tuple[int, int]]:  # always busy, not by us
        clock[0] += 100
        return {c: (clock[0], 0) for c in cores}

    monkeypatch.setattr(masr.system, "_core_ticks", busy_ticks)
    # this process idle in every window (its CPU time in 10 ms ticks would make windows of
    # microseconds read as anything)
    monkeypatch.setattr(masr.system, "_tree_cpu_seconds", lambda: 0.0)
    data = write_planted(tmp_path / "data")
    runs = ["--data", str(data), "--runs", str(tmp_path / "runs")]
    runner = CliRunner()
    for args in (["train", "--model", "mdr", "--epochs", "1", "--dim", "8", *runs],
                 ["evaluate", *runs]):
        said = runner.invoke(app, args)
        assert said.exit_code == 0, (said.stderr, said.exception)
        lines = said.stderr.splitlines()
        assert lines[0].startswith("using 2 CPU thread(s)")
        assert "CPU threads 2 -> 1: other work keeps 2.0 of 2 core(s) busy" in lines
        assert torch_threads.get_num_threads() == 1
    torch_threads.set_num_threads(2)
    quiet = runner.invoke(app, ["evaluate", *runs, "--threads", "2"])
    assert quiet.exit_code == 0 and "CPU threads" not in quiet.stderr
    assert torch_threads.get_num_threads() == 2


def test_governor_on_four_cores_steps_through_few_counts(monkeypatch, torch_threads) -> None:
    """Windows of 2 s (own CPU seconds over wall seconds); counts 1, 2, 4 only (each count is
    one more compiled version of MASS's scores); a raise needs its free windows in a row."""
    from masr.system import thread_levels

    assert thread_levels(4) == [1, 2, 4] and thread_levels(6) == [1, 2, 4, 6]
    assert thread_levels(1) == [1] and thread_levels(48) == [1, 2, 4, 8, 16, 32, 48]
    machine = _Machine(monkeypatch, busy=4.0, own=2.5, cores=4, seconds=2.0)
    said: list[str] = []
    torch_threads.set_num_threads(4)
    with governed_threads(said.append, every=2.0) as governor:
        machine.second()
        poll_threads()  # 1.5 cores taken: 2.5 left, so 2 threads (3 is no level)
        assert governor.threads == 2 == torch_threads.get_num_threads()
        assert said == ["CPU threads 4 -> 2: other work keeps 1.5 of 4 core(s) busy"]
        machine.busy, machine.own = 2.0, 2.0  # the other work ended
        machine.second()
        poll_threads()
        machine.busy, machine.own = 3.0, 2.0  # a burst: not free, the count of free resets
        machine.second()
        poll_threads()
        machine.busy = 2.0
        machine.second()
        poll_threads()
        assert governor.threads == 2  # one free window since the burst: two needed
        machine.second()
        poll_threads()
        assert governor.threads == 4 and said[-1].startswith("CPU threads 2 -> 4")


def test_governor_follows_a_count_set_elsewhere(monkeypatch, torch_threads) -> None:
    machine = _Machine(monkeypatch, busy=1.0, own=1.0)
    torch_threads.set_num_threads(2)
    with governed_threads(every=1.0) as governor:
        torch_threads.set_num_threads(1)  # e.g. an inner block, or the library's user
        for _ in range(3):
            machine.second()
            poll_threads()
        assert governor.threads == 2 == torch_threads.get_num_threads()  # free: back up


def test_child_processes_count_as_this_process() -> None:
    """torch.compile's workers are child processes: their CPU time is this process's, not
    other work's (QA: a compile read as other work and dropped a thread)."""
    from masr.system import _tree_cpu_seconds

    before = _tree_cpu_seconds()
    if before is None:
        pytest.skip("no /proc here")
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.process_time() + 0.6\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while _tree_cpu_seconds() - before < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)  # the child is still running: it counts while alive
        assert _tree_cpu_seconds() - before >= 0.5
    finally:
        child.kill()
        child.wait()


def test_training_steps_and_evaluation_batches_poll_the_governor(
    monkeypatch, tmp_path
) -> None:
    from conftest import write_planted
    from typer.testing import CliRunner

    import masr.evaluate
    import masr.train
    from masr_cli.main import app

    polls = {"train": 0, "evaluate": 0}

    def counter(where: str):
        def poll() -> None:
            polls[where] += 1
        return poll

    monkeypatch.setattr(masr.train, "poll_threads", counter("train"))
    monkeypatch.setattr(masr.evaluate, "poll_threads", counter("evaluate"))
    data = write_planted(tmp_path / "data")  # 216 training rows: 27 steps of 8 an epoch
    said = CliRunner().invoke(app, ["train", "--model", "mdr", "--epochs", "2", "--dim", "8",
                                    "--batch-size", "8", "--threads", "1", "--data", str(data),
                                    "--runs", str(tmp_path / "runs")])
    assert said.exit_code == 0, said.stderr
    assert polls["train"] >= 2 * 27 and polls["evaluate"] >= 2 * 2, polls
