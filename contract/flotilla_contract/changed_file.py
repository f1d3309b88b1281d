"""A file re-read only when it changes: the model list file of a multi-model server and the LoRA list file.

Why by (modification time, size, inode): a Kubernetes ConfigMap mounted as a directory is updated by swapping
its `..data` symlink to a new directory, which changes the inode the path resolves to even where the time
and size might not (os.stat follows the link); an editor's save changes the time or the size.
"""

from __future__ import annotations

import os


class ChangedFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None

    def read_if_changed(self) -> str | None:
        """The file's text if it changed since the last call (always on the first), else None. OSError when it
        cannot be read; a version that failed is not read again until it changes."""
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        with open(self.path, encoding="utf-8") as fh:
            return fh.read()
