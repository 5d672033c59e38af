"""Run the benchmarks: `nox -s bench [-- NAME ...]` or `python benchmarks/run.py [NAME ...]`.

Each `benchmarks/bench_<name>.py` is a standalone script: it measures, prints a readable
summary on stderr and writes its figures as JSON to `bench-out/<name>.json`. Benchmarks are
never tests: they are rerun on a quiet machine and their figures quoted with the machine.
Real data defaults to ../shared/data/aotm2011.csv.gz (override with MASR_BENCH_DATA).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    available = {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}
    names = [a for a in argv if not a.startswith("-")] or list(available)
    extra = [a for a in argv if a.startswith("-")]
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
