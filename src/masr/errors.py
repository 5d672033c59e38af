"""The one exception type the CLI turns into a single error line and a non-zero exit."""

from __future__ import annotations


class MasrError(Exception):
    """A problem the user can fix (bad input, missing files, impossible settings).

    The message must be one line that names the file or option and the problem; the CLI prints
    it as ``masr: error: <message>`` on stderr and exits with status 1, without a traceback.
    """
