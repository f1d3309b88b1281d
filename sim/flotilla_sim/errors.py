"""The simulator's one user error, so the CLI can tell a bad input (one line, exit 2) from a bug (a traceback).

The readers (`workload`, `server_model`) raise `InputError` for what a user supplied: a trace file, a
traces directory, a bench profile. Its message names the input and says what to change, on one line.
"""

from __future__ import annotations


class InputError(ValueError):
    """A bad input a user can fix; the message names it and says what to change."""
