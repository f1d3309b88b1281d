"""The operator's side of the layer table (docs/architecture.md, "Layers"): torch-free, and every
flag it renders is one the server accepts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from flotilla_contract.flags import FLAGS_BY_NAME
from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children
from flotilla_server.cli import parse_settings

from tests.support.examples import EXAMPLES, ROOT, load_example


def rendered_args(path) -> list[str]:
    obj = load_example(path)
    owner = Owner(obj["metadata"]["name"], obj["metadata"]["namespace"], "uid-1", types.parse_spec(obj["spec"]))
    (deployment,) = [c for c in desired_children(owner, types.DEFAULT_SERVER_IMAGE, False) if c["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_rendered_flag_is_one_the_server_accepts(path):
    args = rendered_args(path)
    extra = set(load_example(path)["spec"].get("server", {}).get("extraArgs") or [])
    rendered_flags = [a for a in args if a.startswith("--") and a not in extra]
    assert rendered_flags and set(rendered_flags) <= set(FLAGS_BY_NAME)
    settings = parse_settings(args, environ={})  # the server's own parser: exits on an unknown flag
    assert settings.served_model_name == load_example(path)["spec"]["model"]["name"]


def test_the_operator_cli_loads_no_torch_and_no_server():
    code = ("import sys, flotilla_operator.cli, flotilla_operator.runner, flotilla_operator.render; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flotilla_server')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
