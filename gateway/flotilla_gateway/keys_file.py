"""The keys in force, re-read from the keys file while the gateway runs, so that a rotated Secret takes
effect without a restart and a refused one changes nothing.

The kubelet rewrites a mounted Secret in place (one atomic swap), about a minute after the Secret changes.
The gateway reads the file every --api-keys-reload-interval-s and parses it only when its bytes changed. A
version that keys.parse_keys refuses leaves the last good keys in force: a typo must neither let anyone in
nor lock every client out. The gateway logs and counts each refused version once.
"""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path

from flotilla_gateway.keys import Tenant, parse_keys, read_keys_file


class Reload(Enum):
    UNCHANGED = "unchanged"  # the same bytes (or the same read error) as the last read: nothing parsed
    LOADED = "loaded"  # a new version parsed: its keys are in force
    REFUSED = "refused"  # a new version failed to parse or read: the last good keys stay, `refusal` says why


class KeysFile:
    def __init__(self, path: str | Path) -> None:
        """Read and parse the file; ValueError (one line: what to change) when it cannot start the gateway."""
        self.path = Path(path)
        self._seen: bytes | str = read_keys_file(self.path)  # the last version read: its bytes, or why not
        self.keys: dict[str, Tenant] = parse_keys(self._seen, str(self.path))
        self.loaded_at_s = time.time()  # wall clock of the last good load
        self.refusal: str | None = None  # why the last new version was refused; None once one loads

    def reload(self) -> Reload:
        try:
            version: bytes | str = read_keys_file(self.path)
        except ValueError as error:
            version = str(error)
        if version == self._seen:
            return Reload.UNCHANGED
        self._seen = version
        try:
            if isinstance(version, str):
                raise ValueError(version)
            keys = parse_keys(version, str(self.path))
        except ValueError as error:
            self.refusal = str(error)
            return Reload.REFUSED
        self.keys, self.loaded_at_s, self.refusal = keys, time.time(), None
        return Reload.LOADED
