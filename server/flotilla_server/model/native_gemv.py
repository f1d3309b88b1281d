"""The native CPU kernels of model/kernels/ (one library, `libflotilla_kernels.so`), when `make setup` or the
server image's build built them (scripts/build_kernels.py, into kernels/build beside this file).

- `gemv_one_row`: the one-row float32 kernel of kernels/gemv.cpp, or None when the library did not load;
  model/linear.py then keeps MKL's and oneDNN's one-row paths.
- `native_op(name)`: any op of the library (`torch.ops.flotilla.<name>`), or None when it did not load or
  lacks that op (a library built before the op was added: `make setup` rebuilds it); model/quant_blocks.py
  takes its GGUF block products from here.

The reason a kernel is missing is logged once. FLOTILLA_NATIVE_KERNELS=off leaves the library unloaded (for
comparisons in one benchmark run).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).resolve().parent / "kernels" / "build" / "libflotilla_kernels.so"
FALLBACKS = "one-row float32 products use oneDNN or MKL, GGUF block products a torch fallback"


def _load() -> bool:
    if os.environ.get("FLOTILLA_NATIVE_KERNELS", "on") == "off":
        return False
    if not LIBRARY.is_file():
        log.warning("no native CPU kernels at %s (make setup builds them); %s", LIBRARY, FALLBACKS)
        return False
    try:
        torch.ops.load_library(str(LIBRARY))
        return True
    except (OSError, RuntimeError) as error:  # built for another torch: rebuild with make setup
        log.warning("native CPU kernels at %s did not load (%s); %s", LIBRARY, str(error).splitlines()[0][:200],
                    FALLBACKS)
        return False


LOADED = _load()


def native_op(name: str) -> Callable[..., Any] | None:
    """torch.ops.flotilla.<name>, or None (logged) when the library did not load or has no such op."""
    if not LOADED:
        return None
    try:
        return getattr(torch.ops.flotilla, name)
    except (AttributeError, RuntimeError):
        log.warning("the native CPU kernels at %s have no op %s: built from older sources, make setup rebuilds "
                    "them", LIBRARY, name)
        return None


gemv_one_row: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = native_op("gemv_one_row")
