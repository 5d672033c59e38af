"""Run the benchmarks: `nox -s bench [-- NAME ...]` or `python benchmarks/run.py [NAME ...]`.

Each `benchmarks/bench_<name>.py` is a standalone script: it measures, prints a readable
summary on stderr and writes its figures as JSON under `bench-out/` (benchmarks/README.md says
which file). Scripts that measure something given to them (``NEEDS_ARGS``: a trained run's
checkpoint) are left out of a run without names; named, they get only the options that start
with ``-`` (``--help``): run them directly with their arguments (``python
benchmarks/bench_step.py CHECKPOINT --data DIR``). Benchmarks are never tests: they are rerun
on a quiet machine and their figures quoted with the machine.
Real data defaults to ../shared/data/aotm2011.csv.gz (override with MASR_BENCH_DATA).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: benchmarks of something the caller gives, left out of a run without names (what to pass)
NEEDS_ARGS = {"step": "a run's checkpoint and --data DIR"}


def main(argv: list[str]) -> int:
    available = {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}
    extra = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        names = [n for n in available if n not in NEEDS_ARGS]
        for name, what in NEEDS_ARGS.items():
            print(f"(bench {name} needs {what}: `python benchmarks/bench_{name}.py --help`)",
                  file=sys.stderr)
    unknown = sorted(set(names) - set(available))
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; have: {', '.join(available)}",
            file=sys.stderr,
        )
        return 2
    status = 0
    for name in names:
        print(f"== bench {name}", file=sys.stderr, flush=True)
        status |= subprocess.call([sys.executable, str(available[name]), *extra])
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
