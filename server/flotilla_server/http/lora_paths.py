"""Where `POST /v1/load_lora_adapter` may read from: only under the `--lora-dir` directories.

Why: a load names a path on the server's disk; without a bound, anyone holding the API key (or anyone, with
no key) could make the server open any directory it can read. The rule is a pure function of real paths
(`path_problem`); `resolve` is its thin shell over the file system, run off the event loop by the caller.

Rules:
- off (403) when no --lora-dir is given;
- lora_path must be absolute; it is resolved to its real path (symlinks followed, `..` folded) and must lie
  strictly under the real path of a --lora-dir: a symlink inside an allowed directory that points out of it
  is refused, as is the allowed directory itself;
- the adapter's two files, where they exist, must resolve under an allowed directory too (a symlinked
  weights file cannot point out of it);
- the engine reads the resolved path, never the one sent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# model/lora_adapter.py's CONFIG_FILE and WEIGHTS_FILE (that module loads torch, which this layer never does)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def is_under(path: str, directory: str) -> bool:
    """`path` lies strictly below `directory` (both real, absolute paths)."""
    return path != directory and path.startswith(directory.rstrip("/") + "/")


def path_problem(sent: str, real: str, real_files: Sequence[str], real_dirs: Sequence[str]) -> str | None:
    """Why the adapter at `sent` (real path `real`, its files' real paths `real_files`) may not be read, or None."""
    if not os.path.isabs(sent):
        return f"lora_path {sent!r} is relative: give the adapter directory's absolute path."
    allowed = " or ".join(real_dirs)
    if not any(is_under(real, d) for d in real_dirs):
        shown = sent if real == sent else f"{sent} (really {real})"
        return (f"lora_path {shown} is not under a directory this server loads adapters from (--lora-dir): "
                f"put the adapter under {allowed}.")
    for file in real_files:
        if not any(is_under(file, d) for d in real_dirs):
            return f"lora_path {sent}: a file of the adapter resolves to {file}, outside {allowed} (--lora-dir)."
    return None


def resolve(sent: str, dirs: Sequence[str]) -> tuple[str, str | None]:
    """The real path to read, and why it may not be read (None: it may). Touches the file system: call it
    on a thread."""
    real_dirs = [os.path.realpath(d) for d in dirs]
    real = os.path.realpath(sent) if os.path.isabs(sent) else sent
    files = [os.path.realpath(os.path.join(real, f)) for f in ADAPTER_FILES if os.path.lexists(os.path.join(real, f))]
    return real, path_problem(sent, real, files, real_dirs)
