"""What every benchmark plot shares: saving a figure, and redrawing a saved report from the command line
(`python -m flotilla_server.bench.<plot module> REPORT.json PLOT.png`), so a plot is remade without a rerun."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path, dpi: int = 100) -> None:
    """Lays out `fig`, writes it to `path` (its folder made) and frees it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def redraw_main(argv: list[str], module: str, plot: Callable[[dict[str, Any], Path], None]) -> int:
    """`module REPORT.json PLOT.png`: `plot` of the saved report; a usage line and 2 otherwise."""
    if len(argv) != 2:
        print(f"usage: python -m {module} REPORT.json PLOT.png", file=sys.stderr)
        return 2
    plot(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    return 0
