"""The one-row float32 kernel of model/kernels/gemv.cpp, when `make setup` or the server image's build built
it (scripts/build_kernels.py, into kernels/build beside this file); `gemv_one_row` is None when it did not,
and model/linear.py then keeps MKL's and oneDNN's one-row paths. The reason is logged once, at import.

FLOTILLA_NATIVE_KERNELS=off leaves it unloaded (for comparisons in one benchmark run).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).resolve().parent / "kernels" / "build" / "libflotilla_kernels.so"


def _load() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    if os.environ.get("FLOTILLA_NATIVE_KERNELS", "on") == "off":
        return None
    if not LIBRARY.is_file():
        log.warning("no native CPU kernels at %s (make setup builds them); one-row float32 products use "
                    "oneDNN or MKL", LIBRARY)
        return None
    try:
        torch.ops.load_library(str(LIBRARY))
        return torch.ops.flotilla.gemv_one_row
    except (OSError, RuntimeError) as error:  # built for another torch: rebuild with make setup
        log.warning("native CPU kernels at %s did not load (%s); one-row float32 products use oneDNN or MKL",
                    LIBRARY, str(error).splitlines()[0][:200])
        return None


gemv_one_row = _load()
