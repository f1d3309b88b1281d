"""The command-line parser every Flotilla program uses: a user's mistake is one line, not a usage block.

In the contract so that torch-free programs (flotilla-sim) share it with flotilla-server.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block), exit 2, and point at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
