"""The one exception type for user-facing verify failures.

Why a type of its own: the CLI turns it into a single ``error: ...`` line and exit status 2,
so bad input never ends in a traceback wall, while real bugs still show their traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 2


class VerifyError(Exception):
    """Bad input or an unusable environment; the message is one line with a hint."""
