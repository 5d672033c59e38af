"""Count what a benchmark script launches: CUDA kernels, host-device copies and synchronising
calls, and the ATen operators that force a synchronisation, per training step.

    python benchmarks/kernel_count.py --per-step aten::searchsorted -- \
        benchmarks/bench_train.py --skip-cpu --models mdr --batch-sizes default --max-seconds 3

The script after ``--`` runs in this process under ``torch.profiler`` (CPU activity, and CUDA
where there is a GPU), whatever version of masr it imports, so an old source tree (``PYTHONPATH=
<old>/src``) and this one are counted the same way. On a GPU a step of 1,024 rows is bound by
kernel launches and by the host waiting for the device (docs/training.md, Speed): more kernels
or one more ``.item()`` per step shows here when the epoch time alone cannot say why.
``--per-step`` names an operator called once per training step (MDR and MASS sort their
batch once per step with ``searchsorted``), to divide the counts by; the totals are printed
too. ``--json`` writes the counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import runpy
import sys
from pathlib import Path

#: operators whose result the host must read (a device-to-host copy and a wait on a GPU)
SYNCING_OPS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::unique",
    "aten::_unique2",
    "aten::masked_select",
    "aten::is_nonzero",
    "aten::equal",
)
#: CUDA runtime calls that wait for the device or copy through the host
SYNCING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def count(events: list) -> dict[str, collections.Counter]:
    """Counters of the profiler's events by kind: "ops" (every ATen operator), "kernels"
    (device kernels by name), "runtime" (CUDA runtime calls by name)."""
    ops: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    runtime: collections.Counter = collections.Counter()
    for e in events:
        kind = str(getattr(e, "device_type", "")).rsplit(".", 1)[-1]
        name = e.name
        if kind == "CUDA":
            kernels[name] += 1
        elif name.startswith("cuda"):
            runtime[name] += 1
        elif name.startswith("aten::"):
            ops[name] += 1
    return {"ops": ops, "kernels": kernels, "runtime": runtime}


def summary(counts: dict[str, collections.Counter], per_step: str) -> dict:
    """Totals and per-step figures of ``count``'s counters."""
    steps = counts["ops"].get(per_step, 0)
    launches = sum(n for name, n in counts["runtime"].items() if "LaunchKernel" in name)
    syncing_ops = {op: counts["ops"][op] for op in SYNCING_OPS if counts["ops"].get(op)}
    syncing_calls = {
        c: n for c, n in counts["runtime"].items() if any(c.startswith(s) for s in SYNCING_CALLS)
    }
    totals = {
        "aten_ops": sum(counts["ops"].values()),
        "kernels": sum(counts["kernels"].values()),
        "kernel_launches": launches,
        "syncing_ops": syncing_ops,
        "syncing_calls": syncing_calls,
    }
    out: dict = {"per_step_marker": per_step, "steps": steps, "totals": totals}
    if steps:
        out["per_step"] = {
            "aten_ops": totals["aten_ops"] / steps,
            "kernels": totals["kernels"] / steps,
            "kernel_launches": launches / steps,
            "syncing_ops": {k: v / steps for k, v in syncing_ops.items()},
            "syncing_calls": {k: v / steps for k, v in syncing_calls.items()},
        }
    out["top_kernels"] = counts["kernels"].most_common(15)
    out["top_ops"] = counts["ops"].most_common(25)
    return out


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("kernel_count: usage: kernel_count.py [options] -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-step", default="aten::searchsorted", help="one call per step")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args(argv[:cut])
    script, script_args = argv[cut + 1], argv[cut + 2 :]

    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sys.argv = [script, *script_args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # the script's own imports
    with profile(activities=activities) as prof:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                print(f"kernel_count: {script} exited with {stop.code}", file=sys.stderr)
    result = summary(count(list(prof.events())), args.per_step)
    result["script"] = [script, *script_args]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
