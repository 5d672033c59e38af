"""The one exception type the CLI turns into a single error line and a non-zero exit."""

from __future__ import annotations

from typing import Any


class MasrError(Exception):
    """A problem the user can fix (bad input, missing files, impossible settings).

    The message must be one line that names the file or option and the problem; the CLI prints
    it as ``masr: error: <message>`` on stderr and exits with status 1, without a traceback.
    """


def check_instance(
    value: Any, kind: type | tuple[type, ...], what: str, expected: str = ""
) -> None:
    """Refuse (MasrError) a library argument of the wrong kind at once, not as an
    AttributeError deep inside: "WHAT: expected EXPECTED (the kind's name), not TYPE VALUE"."""
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        name = expected or " or ".join(k.__name__ for k in kinds)
        raise MasrError(f"{what}: expected {name}, not {type(value).__name__} {value!r:.60}")
