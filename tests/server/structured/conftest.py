"""One SmolLM2-135M-Instruct server for the structured-output tests over HTTP that only read from it
(test_http.py, test_tools.py): started once when both run in one process (a SmolLM2 start is ~3 s)."""

from __future__ import annotations

import pytest

from tests.server.http.server_process import ServerProcess, run_server
from tests.server.model.gguf_reference import smollm2_gguf


@pytest.fixture(scope="package")
def smollm2_server(tmp_path_factory) -> ServerProcess:
    # debug: the rendered prompts are logged (test_tools.py reads them)
    with run_server("--max-model-len", "2048", "--kv-cache-memory", "256Mi", "--log-level", "debug",
                    tmp_path=tmp_path_factory.mktemp("smollm2"), model_args=("--model", str(smollm2_gguf()))) as s:
        yield s
