"""One shared flotilla-server process on tiny for the HTTP and online-bench tests that need no special flags."""

from __future__ import annotations

import pytest

from tests.server.http.server_process import ServerProcess, run_server

STANDARD_ARGS = ("--max-num-seqs", "64", "--max-model-len", "512", "--queue-timeout-s", "30")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    with run_server(*STANDARD_ARGS, tmp_path=tmp_path_factory.mktemp("server")) as s:
        yield s
