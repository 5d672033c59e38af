"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s demo`, `nox -s bench`.

Every session installs PyTorch's CPU build through constraints/cpu.txt; the package's own
dependency range stays open so that users with a GPU get a CUDA build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

CONSTRAINTS = ("-c", "constraints/cpu.txt")


def _install(session: nox.Session, extras: str = "test") -> None:
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite (CPU; GPU tests skip themselves without CUDA)."""
    _install(session)
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the library, the CLI, the tests and the benchmarks."""
    session.install("ruff")
    session.run("ruff", "check", "src", "masr_cli", "tests", "benchmarks", "noxfile.py")


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job on the embedded dataset: prep -> train amasr -> export -> score."""
    _install(session, "plot")
    workdir = session.create_tmp()
    data, runs = f"{workdir}/data", f"{workdir}/runs"
    onnx_path = f"{workdir}/exported/masr.onnx"
    session.run("masr", "prep", "--out", data)
    session.run("masr", "train", "--model", "amasr", "--data", data, "--runs", runs)
    session.run("masr", "evaluate", "--data", data, "--runs", runs, "--model", "all")
    session.run("masr", "export", "--runs", runs, "--out", onnx_path)
    session.run("masr", "score", "examples/playlists.csv", "--model", onnx_path)


@nox.session
def bench(session: nox.Session) -> None:
    """Speed and memory benchmarks (see benchmarks/README.md). Pass names to run a subset."""
    _install(session, "test")
    # yardsticks for the benchmarks only, never masr dependencies (issue 13: implicit's BPR)
    session.install(*CONSTRAINTS, "implicit")
    session.run("python", "benchmarks/run.py", *session.posargs)
