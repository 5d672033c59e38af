"""benchmarks/kernel_count.py: what a script launches, per step, counted the same for any
version of masr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import kernel_count  # noqa: E402


def _event(name: str, device: str = "DeviceType.CPU") -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device)


def test_counts_by_kind_and_per_step() -> None:
    events = [
        *[_event("aten::searchsorted") for _ in range(4)],
        *[_event("aten::mm") for _ in range(8)],
        _event("aten::item"),
        _event("aten::_local_scalar_dense"),
        *[_event("cudaLaunchKernel") for _ in range(12)],
        _event("cudaStreamSynchronize"),
        _event("cudaMemcpyAsync"),
        *[_event("void gemm_kernel<float>", "DeviceType.CUDA") for _ in range(8)],
        *[_event("elementwise_kernel", "DeviceType.CUDA") for _ in range(4)],
    ]
    out = kernel_count.summary(kernel_count.count(events), "aten::searchsorted")
    assert out["steps"] == 4
    assert out["totals"]["aten_ops"] == 14
    assert out["totals"]["kernels"] == 12 and out["totals"]["kernel_launches"] == 12
    assert out["totals"]["syncing_ops"] == {"aten::item": 1, "aten::_local_scalar_dense": 1}
    assert out["totals"]["syncing_calls"] == {"cudaStreamSynchronize": 1, "cudaMemcpyAsync": 1}
    assert out["per_step"]["kernels"] == 3.0
    assert out["per_step"]["syncing_calls"]["cudaMemcpyAsync"] == 0.25
    assert out["top_kernels"][0] == ("void gemm_kernel<float>", 8)


def test_without_the_marker_there_is_no_per_step() -> None:
    out = kernel_count.summary(kernel_count.count([_event("aten::mm")]), "aten::searchsorted")
    assert out["steps"] == 0 and "per_step" not in out
    assert out["totals"]["aten_ops"] == 1


def test_counts_a_real_script_under_the_profiler(tmp_path: Path) -> None:
    script = tmp_path / "steps.py"
    script.write_text(
        "import torch\n"
        "x = torch.arange(10.0)\n"
        "for _ in range(5):\n"
        "    torch.searchsorted(x, torch.tensor([3.5]))\n"
        "    float(x.sum())\n"
    )
    out = tmp_path / "counts.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "kernel_count.py"), "--json", str(out), "--", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(out.read_text())
    assert counts["steps"] == 5
    assert counts["per_step"]["syncing_ops"]["aten::item"] == 1.0  # float() reads a tensor
    assert counts["script"] == [str(script)]


def test_usage_without_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "kernel_count.py")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "usage" in done.stderr
