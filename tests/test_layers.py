"""The layer rules of docs/design.md, read from the source's import statements:

1. the library (``masr``) never imports the CLI (``masr_cli``);
2. data and scoring never import torch, at any depth (``masr score`` runs without it);
   settings, the runs registry/store and the report import it only inside functions;
3. models do no I/O (no files, no file formats: data comes in as tensors and arrays);
4. no import cycle among masr modules (module-level imports; ``TYPE_CHECKING`` ones excluded).

Each rule is a function over {module name: source}, checked on the real tree and, so that a
rule that silently passes cannot hide, on a small tree that breaks it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: modules that must never import torch, directly or through what they import
DATA_AND_SCORING = (
    "masr.config", "masr.errors", "masr.atomic", "masr.lock", "masr.io", "masr.prep",
    "masr.synth", "masr.dataset", "masr.score", "masr.score_ray", "masr.onnx_format",
)
#: modules that may import torch inside functions only (the CLI imports them for --help)
TORCH_LAZY = ("masr", "masr.runs", "masr.runs.registry", "masr.runs.store", "masr.runs.make",
              "masr.report", "masr.evaluate", "masr.seed", "masr.system")
#: what a model module may not import: files and file formats are the pipeline's business
IO_MODULES = ("polars", "json", "pathlib", "pickle", "shutil", "csv", "masr.atomic", "masr.io",
              "masr.checkpoint", "masr.dataset", "masr.prep", "masr.score", "masr.export")


def _sources() -> dict[str, str]:
    out = {}
    for base, package in ((ROOT / "src", "masr"), (ROOT, "masr_cli")):
        for path in sorted((base / package).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path.read_text()
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(source: str, modules: set[str], top_level_only: bool) -> set[str]:
    """Modules imported by ``source`` (``from a import b`` counts as ``a``, and as ``a.b``
    when that is one of ``modules``); ``TYPE_CHECKING`` blocks are skipped."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt], top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(
                    f"{node.module}.{a.name}" for a in node.names
                    if f"{node.module}.{a.name}" in modules
                )
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if not isinstance(inner, list) or not inner:
                    continue
                nested = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                visit([n for n in inner if isinstance(n, ast.stmt)], top and not nested)

    visit(ast.parse(source).body, True)
    return found


def _is(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def library_imports_cli(sources: dict[str, str]) -> list[str]:
    mods = set(sources)
    return [
        f"{m} imports {i}" for m, src in sources.items() if _is(m, "masr")
        for i in sorted(_imports(src, mods, top_level_only=False)) if _is(i, "masr_cli")
    ]


def torch_reached(sources: dict[str, str], names: tuple[str, ...], anywhere: bool) -> list[str]:
    """torch imports reachable from ``names``: in the module itself (anywhere in it when
    ``anywhere``, else at module level), then through module-level masr imports."""
    mods = set(sources)
    problems = []
    for start in names:
        if anywhere and any(_is(i, "torch") for i in _imports(sources[start], mods, False)):
            problems.append(f"{start} imports torch")
        seen, todo = {start}, [start]
        while todo:
            mod = todo.pop()
            for i in _imports(sources[mod], mods, top_level_only=True):
                if _is(i, "torch"):
                    problems.append(f"{start} reaches torch through {mod}")
                elif i in mods and i not in seen:
                    seen.add(i)
                    todo.append(i)
    return sorted(set(problems))


def models_doing_io(sources: dict[str, str]) -> list[str]:
    mods = set(sources)
    problems = []
    for m, src in sources.items():
        if not _is(m, "masr.models"):
            continue
        problems += [
            f"{m} imports {i}" for i in sorted(_imports(src, mods, top_level_only=False))
            if any(_is(i, bad) for bad in IO_MODULES)
        ]
        calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]
        if any(isinstance(c.func, ast.Name) and c.func.id == "open" for c in calls):
            problems.append(f"{m} calls open()")
    return problems


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Cycles of the module-level import graph among masr and masr_cli modules."""
    mods = set(sources)
    graph = {m: sorted(i for i in _imports(s, mods, True) if i in mods and i != m)
             for m, s in sources.items()}
    cycles, state = [], {}

    def dfs(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                dfs(nxt, [*path, nxt])
        state[node] = "done"

    for m in sorted(graph):
        if m not in state:
            dfs(m, [m])
    return cycles


def test_library_never_imports_the_cli() -> None:
    assert library_imports_cli(_sources()) == []


def test_data_and_scoring_never_import_torch() -> None:
    sources = _sources()
    assert set(DATA_AND_SCORING + TORCH_LAZY) <= set(sources)
    assert torch_reached(sources, DATA_AND_SCORING, anywhere=True) == []
    assert torch_reached(sources, TORCH_LAZY, anywhere=False) == []


def test_models_do_no_io() -> None:
    assert models_doing_io(_sources()) == []


def test_no_import_cycles() -> None:
    assert import_cycles(_sources()) == []


BROKEN = {
    "masr.score": "import numpy\nfrom masr.helper import go\n",
    "masr.helper": "import torch\n",
    "masr.config": "def f():\n    from masr_cli.main import app\n",
    "masr.models.bad": "from pathlib import Path\n\ndef load():\n    return open('x')\n",
    "masr.a": "from masr import b\n",
    "masr.b": "from masr.a import thing\n",
    "masr": "",
}


@pytest.mark.parametrize(
    ("rule", "want"),
    [
        (library_imports_cli, ["masr.config imports masr_cli.main"]),
        (lambda s: torch_reached(s, ("masr.score",), True),
         ["masr.score reaches torch through masr.helper"]),
        (models_doing_io, ["masr.models.bad imports pathlib", "masr.models.bad calls open()"]),
        (import_cycles, [["masr.a", "masr.b", "masr.a"]]),
    ],
)
def test_each_rule_catches_its_violation(rule, want) -> None:
    assert rule(BROKEN) == want
