"""Step hooks for engine tests (EngineOptions.step_hook): module-level, so the engine process can unpickle them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def pause_at_step(step: int, marker: str, step_index: int, wait_for_message: Callable[[float], bool]) -> None:
    """At `step`, between plan and execution: create `marker`, then hold the step until a message is pending."""
    if step_index != step:
        return
    Path(marker).touch()
    assert wait_for_message(60.0), "no message reached the paused engine"


def record_threads(path: str, step_index: int, wait_for_message: Callable[[float], bool]) -> None:
    """Append the thread count the step runs on (torch's, on the thread that runs the steps) to `path`."""
    import torch

    with Path(path).open("a") as f:
        f.write(f"{torch.get_num_threads()}\n")
