"""The llama-server build for benchmarks: what it refuses in one line, and that a damaged sdist in the cache is
thrown away rather than built (the build itself takes minutes: `make bench`'s, never `make test`'s)."""

from __future__ import annotations

import pytest
from flotilla_server.bench import llama_server_build as build


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert build.main(["--jobs", "0"]) == 2
    assert capsys.readouterr().err.strip() == "llama_server_build: --jobs must be >= 1"


def test_an_unknown_variant_is_named():
    with pytest.raises(build.BuildError, match="variant 'avx9' is not one of avx2, native"):
        build.ensure_llama_server("avx9")


def test_a_cached_sdist_with_the_wrong_sha256_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOTILLA_CACHE_DIR", str(tmp_path))
    sdist = tmp_path / "llama.cpp" / build.SDIST_NAME
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"not the sdist")
    with pytest.raises(build.BuildError, match=r"not the pinned .*: removed; run again"):
        build._sdist()
    assert not sdist.exists()


def test_a_built_binary_is_found_in_the_cache_without_building(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOTILLA_CACHE_DIR", str(tmp_path))
    binary = build.binary_path("avx2")
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    assert build.ensure_llama_server("avx2") == binary
