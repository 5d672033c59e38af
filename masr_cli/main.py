"""Wires the commands; each lives in its own module and wraps one library function."""

from __future__ import annotations

import sys
from typing import Annotated

try:  # Ctrl-C while the commands load (QA: a KeyboardInterrupt traceback): one line, 130
    import typer

    from masr_cli import analyze, evaluate, export, prep, reproduce, score, synth, train
    from masr_cli._common import error_line, handle_errors, stopped, unwrap
except KeyboardInterrupt:
    sys.stderr.write("masr: error: interrupted\n")
    raise SystemExit(130) from None

app = typer.Typer(
    name="masr",
    help=(
        "Playlist continuation with Mahalanobis distance-based attentive song recommenders "
        "(MDR, MASS, MASR and adversarial AMDR/AMASS/AMASR, SIGIR 2019).\n\n"
        "Typical run: masr prep → masr train --model amasr → masr evaluate → masr export → "
        "masr score playlists.csv > recs.csv"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from masr import __version__

        typer.echo(f"masr {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """masr: automatic playlist continuation."""
    from masr.system import keep_freed_heap, tensor_huge_pages
    from masr_cli._common import console

    # stderr to a file or a pipe (a log): lines whole, not broken at Rich's 80 columns (QA: a
    # note or a title split mid-sentence in log files); a terminal keeps its word wrapping
    console.soft_wrap = not console.is_terminal

    tensor_huge_pages()  # before PyTorch loads: fewer page faults on a CPU (docs/training.md)
    keep_freed_heap()  # a step's large tensors reused from the heap, not mapped afresh


for module in (prep, synth, train, evaluate, export, score, reproduce):
    app.command(name=module.NAME, help=unwrap(module.command.__doc__))(
        handle_errors(module.command)
    )
app.add_typer(analyze.app, name=analyze.NAME, help=unwrap(analyze.HELP))


def _empty_value(args: list[str]) -> str | None:
    """The line for the first empty argument of ``args`` (``--runs ""``, ``--out=``, an empty
    INPUT), None when there is none. No masr option or argument means anything empty, and a
    path that is empty would silently be the working folder: usually a shell variable that
    was never set (``--runs "$RUNS"``)."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            name = arg[:-1]
        elif arg == "":
            name = args[i - 1] if i and args[i - 1].startswith("-") else None
        else:
            continue
        what = f"{name}: an empty value" if name else "an empty argument"
        return f"{what} (an unset shell variable?); give one, or leave it out"
    return None


def run() -> None:
    """Console-script entry point: ``app`` with its usage errors (an unknown option or
    command, a value not among the choices, a missing argument) as one line on stderr, as
    every other error of masr is, pointing to the command's --help; exit status 2."""
    empty = _empty_value(sys.argv[1:])
    if empty is not None:
        error_line(empty)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt as exc:  # outside a command's own handling (parsing, the callback)
        line, status = stopped(exc)
        error_line(line)
        sys.exit(status)
    except typer.Abort:
        error_line("aborted")
        sys.exit(1)
    except Exception as exc:
        # click's (or, in newer typer, its vendored copy's) usage errors, told by class name
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        ctx = getattr(exc, "ctx", None)
        if "NoArgsIsHelpError" in kinds:  # `masr` alone, `masr analyze`: the help, printed
            sys.exit(2)
        if "UsageError" not in kinds:
            raise
        where = ctx.command_path if ctx is not None else "masr"
        message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
        message = message.replace("Value error, ", "")  # the coercion's wording, not ours
        error_line(f"{message} (see {where} --help)")
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
