"""The HTTP layer and the CLI's parser load without torch (docs/architecture.md, "Layers"): checked in a fresh
interpreter, since import-linter sees only the import statements, not what a package's __init__ loads."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["flotilla_server.http.app", "flotilla_server.http.serve", "flotilla_server.cli",
                                    "flotilla_server.http.pool_serve", "flotilla_server.model_cache.policy"])
def test_module_imports_without_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch was loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_model_package_still_loads_torch_when_a_name_is_used():
    code = "import sys; from flotilla_server.model import DecoderModel; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
