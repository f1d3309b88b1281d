"""Static checks of the image recipes, since no docker engine runs here: multi-stage, non-root, pinned base,
torch pinned through constraints.txt, a server image that builds its native kernel and refuses to build
without it, and an operator image that installs everything the operator imports."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

import pytest

from tests.chart.render import REPO_ROOT

DOCKERFILES = {name: REPO_ROOT / "docker" / f"{name}.Dockerfile" for name in ("server", "operator")}
PINNED_BASE = re.compile(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$", re.M)
IMPORT_TO_DISTRIBUTION = {"yaml": "pyyaml", "prometheus_client": "prometheus-client"}
FIRST_PARTY = {"flotilla_contract", "flotilla_operator", "flotilla_server", "flotilla_gateway"}


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_image_is_multi_stage_non_root_on_a_pinned_base(name: str) -> None:
    text = DOCKERFILES[name].read_text()
    assert PINNED_BASE.search(text), f"{name}: pin the base image to an exact python:3.11.x-slim-bookworm tag"
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2, f"{name}: build and runtime stages"
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert user.split(":")[0] not in ("0", "root"), f"{name} runs as root"
    assert "COPY --from=build /opt/flotilla /opt/flotilla" in text
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for path in source.split():
            assert (REPO_ROOT / path).exists(), f"{name}: COPY {path} does not exist"


def test_server_image_pins_torch_through_constraints() -> None:
    text = DOCKERFILES["server"].read_text()
    assert "torch==2.13.0" in (REPO_ROOT / "constraints.txt").read_text().splitlines()
    assert re.search(r'pip install --index-url "\$\{TORCH_INDEX_URL\}" -c constraints\.txt torch==2\.13\.0', text)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "pip install -c constraints.txt '.[server]'" in text


def stages(text: str) -> dict[str, str]:
    """Stage name -> its instructions, backslash-continued lines joined."""
    joined = text.replace("\\\n", "")
    parts = re.split(r"^FROM \S+ AS (\w+)$", joined, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_server_image_builds_the_native_kernel_into_the_installed_package_and_checks_that_it_loads() -> None:
    """The image itself cannot be built here (no docker daemon): these are the steps that make it carry the
    kernel. A build without them still succeeds and serves, only slower, which is why the runtime stage checks."""
    text = DOCKERFILES["server"].read_text()
    build, runtime = stages(text)["build"], stages(text)["runtime"]
    assert re.search(r"apt-get install -y --no-install-recommends g\+\+", build), "the build stage needs a compiler"
    assert not re.search(r"g\+\+|gcc|build-essential", runtime), "no compiler in the runtime stage"
    assert "COPY scripts/build_kernels.py ./scripts/" in build
    # the script, not one g++ line, so kernels added to its SOURCES are built too; --strict fails the build
    assert re.search(r"python scripts/build_kernels\.py --strict --out-dir \"\$out_dir\"", build)
    assert "from flotilla_server.model.native_gemv import LIBRARY; print(LIBRARY.parent)" in build  # where it loads
    assert build.index("'.[server]'") < build.index("scripts/build_kernels.py --strict")  # into the installed copy
    script = ast.parse((REPO_ROOT / "scripts" / "build_kernels.py").read_text())
    command = next(n for n in script.body if isinstance(n, ast.FunctionDef) and n.name == "command")
    flags = [n.value for n in ast.walk(command) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    instructions = re.sub(r"^#.*\n", "", text, flags=re.M)
    for flag in ("-march", "-mavx", "-mtune=native"):  # each kernel picks AVX-512, AVX2 or plain at run time
        assert flag not in instructions and not any(flag in f for f in flags), f"{flag}: the image runs on one kind of node"
    (check,) = re.findall(r'^RUN python -c "(.+)"$', runtime, re.M)
    assert runtime.index("USER 65532") < runtime.index(check), "the check loads it as the server's user"
    assert "from flotilla_server.model import native_gemv" in check
    assert "assert n.gemv_one_row is not None" in check and "assert_close(n.gemv_one_row(x, w), x @ w.T" in check
    assert "assert q.active_isa() != 'torch'" in check and "assert_close(q.quant_matmul(x, b, 2)" in check


def third_party_imports(paths: list) -> set[str]:
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - FIRST_PARTY - {"__future__"}


def base_dependencies() -> set[str]:
    """The distributions of pyproject's base install (no extras), by name."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]}


def test_operator_image_is_a_plain_torch_free_install_of_what_the_operator_imports() -> None:
    text = DOCKERFILES["operator"].read_text()
    assert "--no-deps" not in text, "the base install is torch-free: install it plainly"
    assert re.search(r"pip install -c constraints\.txt \. ", text), "the operator image installs the base distribution"
    installed = base_dependencies()
    sources = sorted((REPO_ROOT / "operator" / "flotilla_operator").rglob("*.py"))
    sources += sorted((REPO_ROOT / "contract" / "flotilla_contract").rglob("*.py"))
    # the chart runs the gateway from it; the gateway's benchmarks (bench/, plots with matplotlib) run from a checkout
    sources += sorted(p for p in (REPO_ROOT / "gateway" / "flotilla_gateway").rglob("*.py") if "bench" not in p.parts)
    needed = {IMPORT_TO_DISTRIBUTION.get(m, m) for m in third_party_imports(sources)}
    assert needed <= installed, f"pyproject's base dependencies lack {sorted(needed - installed)}"
    assert not {"torch", "safetensors", "tokenizers"} & installed
    for path in ("contract", "operator", "gateway"):
        assert f"COPY {path} ./{path}" in text
