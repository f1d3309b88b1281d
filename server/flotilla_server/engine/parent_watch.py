"""A child process that exits when its parent dies, even while it is busy: a SIGKILLed server leaves no
orphan holding memory, a GPU or a port (the engine process, and each of several HTTP processes)."""

from __future__ import annotations

import os
import threading

CHECK_INTERVAL_S = 1.0


def exit_with_parent() -> None:
    """Start a daemon thread that ends this process (exit status 0) once its parent has changed."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            threading.Event().wait(CHECK_INTERVAL_S)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
