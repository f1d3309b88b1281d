"""Build the CPU kernels of server/flotilla_server/model/kernels/ into a shared library that
model/native_gemv.py loads (`make setup` runs this; it is rebuilt when its source or torch changes).

g++ straight from torch's include and library paths: no ninja, no pybind11, no Python module. A machine
without a C++ compiler still serves: the library is missing, the loader says so once, one-row float32
products take oneDNN or MKL instead (docs/serving.md, "CPU threads") and GGUF block products a slower torch
fallback (model/quant_blocks.py). Exits 0 in that case too, with the reason on stderr; with --strict (the
test set-up, the server image), a failed build exits 1.

The library goes where the loader looks, kernels/build beside native_gemv.py: in the source tree by default
(an editable install imports from there); --out-dir puts it elsewhere, e.g. into a non-editable install's
package (docker/server.Dockerfile). No -march: the build targets baseline x86-64 and each kernel picks its
AVX-512, AVX2 or plain path at run time from the CPU's features, so one build runs on every x86-64 node.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "server" / "flotilla_server" / "model" / "kernels"
SOURCES = sorted(KERNELS.glob("*.cpp"))  # every kernel source: one library, one op registry
HEADERS = sorted(KERNELS.glob("*.h"))  # shared by the sources: an edit to one rebuilds too
LIBRARY = KERNELS / "build" / "libflotilla_kernels.so"
STAMP = LIBRARY.with_suffix(".stamp")


def fingerprint(torch_version: str) -> str:
    digest = hashlib.sha256(torch_version.encode())
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def command(output: Path) -> list[str]:
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        shutil.which("g++") or shutil.which("c++") or "g++", "-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in include_paths()), *map(str, SOURCES),
        *(f"-L{p}" for p in library_paths()), *(f"-Wl,-rpath,{p}" for p in library_paths()),
        "-ltorch_cpu", "-lc10", "-o", str(output),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when the build fails")
    parser.add_argument("--out-dir", type=Path, default=LIBRARY.parent,
                        help=f"the directory to write {LIBRARY.name} into: the kernels/build beside the native_gemv.py "
                             "that will load it (default: the source tree's, %(default)s)")
    args = parser.parse_args(argv)
    import torch

    library = args.out_dir / LIBRARY.name
    stamp = library.with_suffix(STAMP.suffix)
    want = fingerprint(torch.__version__)
    if library.is_file() and stamp.is_file() and stamp.read_text() == want:
        print(library)
        return 0
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(".partial.so")
    try:
        subprocess.run(command(partial), check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        print(f"build_kernels: the CPU kernels were not built ({detail.strip()[-2000:]}); one-row float32 "
              "products will use oneDNN or MKL, GGUF block products a torch fallback", file=sys.stderr)
        return 1 if args.strict else 0
    partial.replace(library)
    stamp.write_text(want)
    print(library)
    return 0


if __name__ == "__main__":
    sys.exit(main())
