"""`--help` reads well at a standard 80-column terminal: prose paragraphs are wrapped by Rich
(no ragged half-lines from hard-wrapped docstrings) and example lines are never broken."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from masr_cli.main import app

runner = CliRunner()
COMMANDS = (
    "prep", "synth", "train", "evaluate", "export", "score", "reproduce",
    "analyze dims", "analyze attention", "analyze speed",
)


def _description(command: str) -> list[list[str]]:
    """The paragraphs (lists of rendered lines) between the usage line and the first panel."""
    result = runner.invoke(
        app, [*command.split(), "--help"], env={"COLUMNS": "80", "TERM": "dumb"}
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    stop = next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:stop]:
        assert len(line) <= 80, line
        if line.strip():
            paragraphs[-1].append(line.rstrip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_wraps_at_80_columns(command: str) -> None:
    paragraphs = _description(command)
    assert paragraphs, f"masr {command} --help has no description"
    for para in paragraphs:
        if para[0].startswith("   "):  # an example block: one command per line, never broken
            assert all(line.startswith("   ") for line in para), para
        else:  # prose: every line but the last is filled by the wrapper
            assert all(len(line) >= 55 for line in para[:-1]), para


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--modle", "amasr"], "No such option: --modle"),
        (["train", "--model", "nosuch"], "'nosuch' is not one of 'mdr'"),
        (["nosuchcmd"], "No such command 'nosuchcmd'"),
        (["score"], "Missing argument"),
    ],
)
def test_usage_errors_are_one_line_from_the_console_script(args: list[str], needle: str) -> None:
    """The installed `masr` (``masr_cli.main.run``): a usage error is one `masr: error:` line
    on stderr that names the command's --help, exit status 2, as other errors are one line."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "from masr_cli.main import run; run()", *args],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("masr: error: ") and needle in lines[0]
    assert "--help)" in lines[0] and "Value error" not in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["evaluate", "--runs", ""], "--runs: an empty value"),
        (["prep", "--out="], "--out: an empty value"),
        (["prep", ""], "an empty argument"),
    ],
)
def test_an_empty_value_is_refused_not_read_as_the_working_folder(
    tmp_path, args: list[str], needle: str
) -> None:
    """``--runs "$RUNS"`` with RUNS unset would otherwise be the working folder."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "from masr_cli.main import run; run()", *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stdout == "" and list(tmp_path.iterdir()) == []
    assert proc.stderr.splitlines() == [
        f"masr: error: {needle} (an unset shell variable?); give one, or leave it out"
    ]


def test_the_console_script_keeps_help_version_and_exit_codes(tmp_path) -> None:
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "from masr_cli.main import run; run()", *args],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )

    assert run().returncode == 2  # no command: the help, as click does
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("masr ")
    assert run("train", "--help").returncode == 0
    failed = run("evaluate", "--data", str(tmp_path / "none"))
    assert failed.returncode == 1 and failed.stderr.startswith("masr: error: ")



def test_evaluate_alpha_help_sends_the_choice_to_the_validation_split() -> None:
    """QA: `masr evaluate --alpha` (default --split test) said to export the α it showed, an
    invitation to choose eq. 20's weight on the test split; it names --split valid."""
    import typer.main

    evaluate = typer.main.get_command(app).commands["evaluate"]  # type: ignore[attr-defined]
    (option,) = [p for p in evaluate.params if p.name == "alpha"]
    assert "compare them with --split valid" in option.help
    assert "never on the test split" in option.help


@pytest.mark.parametrize("command", COMMANDS)
def test_no_option_shows_a_python_type_as_its_value(command: str) -> None:
    """A repeatable option names its value (`--alpha A`), not Typer's `<list[float]>`."""
    result = runner.invoke(
        app, [*command.split(), "--help"], env={"COLUMNS": "200", "TERM": "dumb"}
    )
    assert result.exit_code == 0
    assert "list[" not in result.stdout and "dict[" not in result.stdout, command


def test_synth_help_states_the_catalog_size_it_writes(tmp_path) -> None:
    """`masr synth --songs` had no stated default; the help now gives the one it writes."""
    from masr.synth import SynthConfig

    shown = runner.invoke(app, ["synth", "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert shown.exit_code == 0
    assert f"({SynthConfig().n_songs:,} for the default {SynthConfig().users} users)" in (
        " ".join(shown.stdout.split())
    )
    written = runner.invoke(app, ["synth", "--out", str(tmp_path / "s.csv"), "--users", "3"])
    assert written.exit_code == 0 and f"{SynthConfig(users=3).n_songs:,} songs" in written.stderr
    assert SynthConfig(users=3).n_songs == 200  # "at least 200"


#: options whose absence is plain (an output not written, an extra not run): no default to state
_OPT_IN = {
    ("synth", "--playlists"), ("evaluate", "--json"), ("evaluate", "--plot"),
    ("evaluate", "--alpha"), ("score", "--out"),
}


def test_every_option_without_a_shown_default_states_it() -> None:
    """An option whose [default: ...] is hidden says its default in its help (prep's
    --max-playlist-songs and --max-user-playlists said nothing: no outlier is dropped)."""
    import typer

    def commands(group, prefix=""):  # noqa: ANN001, ANN202
        for name, sub in group.commands.items():
            if hasattr(sub, "commands"):
                yield from commands(sub, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", sub

    silent = [
        (name, p.opts[0])
        for name, command in commands(typer.main.get_command(app))
        for p in command.params
        if p.param_type_name == "option" and p.name != "help" and not p.required
        and not p.is_flag and (p.show_default is False or p.default is None)
        and "default" not in (p.help or "").lower() and (name, p.opts[0]) not in _OPT_IN
    ]
    assert silent == []


def test_the_recipe_help_keeps_a_models_own_cpu_value_apart() -> None:
    """`--recipe`'s help read "on a CPU --neg 128 --neg 1024 for mdr", two values of one
    option run together; a comma now parts the plain value from MDR's."""
    from masr.config import CPU_RECIPES
    from masr_cli.train import _recipe_text

    text = _recipe_text("fullrank", cpu=True)
    train = CPU_RECIPES["fullrank"]["train"]
    assert text == f"--neg {train['neg']}, --neg {train['mdr.neg']} for mdr"
