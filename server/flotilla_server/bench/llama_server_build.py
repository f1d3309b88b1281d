"""llama.cpp's own `llama-server`, built once from the sources vendored in a pinned PyPI sdist and cached outside
the repository, for benchmarks that compare Flotilla with it on the same GGUF file (docs/benchmarks.md).

Why build it: it is the peer llama.cpp users run (continuous batching with `--parallel`), and the machine
reaches nothing beyond PyPI, so its sources come from `llama-cpp-python`'s sdist, pinned by version and sha256.
A build takes 9-12 minutes on this project's 2-core development machine (the issue that asked for it
expected 40 on a slower one), so it happens here, on a benchmark's demand, never in `make test`, and lands in `$FLOTILLA_CACHE_DIR/llama.cpp/<version>-<variant>/llama-server` (default `~/.cache/flotilla`).

Variants:
- `native`: `GGML_NATIVE=ON`, what a user building on the machine gets (AVX-512 and VNNI where present);
- `avx2`: `GGML_NATIVE=OFF` with AVX2, FMA and F16C on and AVX-512 off, the peer of Flotilla's forced AVX2 paths.

`python -m flotilla_server.bench.llama_server_build --variant native` builds (or finds) one and prints its path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMON_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF"]
VARIANT_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
             "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"],
}


class BuildError(RuntimeError):
    """The peer could not be built; the message says what failed and where its log is."""


def cache_dir() -> Path:
    return Path(os.environ.get("FLOTILLA_CACHE_DIR", Path.home() / ".cache" / "flotilla")) / "llama.cpp"


def binary_path(variant: str) -> Path:
    return cache_dir() / f"{SDIST_VERSION}-{variant}" / "llama-server"


def _sdist() -> Path:
    """The pinned sdist, downloaded once and checked against its sha256 every time."""
    path = cache_dir() / SDIST_NAME
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={SDIST_VERSION}",
                        "--no-binary", ":all:", "--no-deps", "-d", str(path.parent)], check=True,
                       capture_output=True, text=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        path.unlink()
        raise BuildError(f"{SDIST_NAME} has sha256 {digest}, not the pinned {SDIST_SHA256}: removed; run again")
    return path


def ensure_llama_server(variant: str, jobs: int | None = None, log=print) -> Path:
    """The cached `llama-server` of `variant`, built now if missing (minutes: see above)."""
    if variant not in VARIANT_FLAGS:
        raise BuildError(f"variant {variant!r} is not one of {', '.join(sorted(VARIANT_FLAGS))}")
    binary = binary_path(variant)
    if binary.is_file():
        return binary
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed: the peer is built from source (apt-get install cmake g++)")
    sdist = _sdist()
    with tempfile.TemporaryDirectory(prefix="llama-cpp-build-") as tmp:
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = Path(tmp) / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"
        build = Path(tmp) / "build"
        build_log = cache_dir() / f"build-{variant}.log"
        log(f"building llama-server ({variant}) from {sdist.name}; log: {build_log}")
        with build_log.open("w") as out:
            for step in (["cmake", "-S", str(source), "-B", str(build), *COMMON_FLAGS, *VARIANT_FLAGS[variant]],
                         ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs or os.cpu_count())]):
                if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    raise BuildError(f"{' '.join(step[:3])} failed; see {build_log}")
        built = build / "bin" / "llama-server"
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(binary)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANT_FLAGS), default="native")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every CPU)")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        print("llama_server_build: --jobs must be >= 1", file=sys.stderr)
        return 2
    try:
        print(ensure_llama_server(args.variant, args.jobs, log=lambda m: print(m, file=sys.stderr)))
    except (BuildError, subprocess.CalledProcessError, OSError) as error:
        print(f"llama_server_build: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
