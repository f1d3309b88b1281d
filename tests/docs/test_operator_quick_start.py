"""docs/operator.md's quick start, run in the order written against an empty emulated cluster.

Each line of the block is carried out as kubectl would (create, apply files, get) or, for the operator's
own line, by starting the real `flotilla-operator` with the arguments written there. The emulator checks
what a real API server and its admission would refuse and the quick start once forgot: an object in a
namespace that does not exist, and pods that name a PriorityClass nobody created.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from tests.docs.doc_blocks import ROOT, shell_blocks
from tests.support.k8s_emulator import EmulatorHandle, serve
from tests.support.k8s_kinds import Kind, kind_from_crd
from tests.support.operator_process import operator_process

DOC = ROOT / "docs" / "operator.md"
CLUSTER_KINDS = (  # served by every cluster, beyond what the emulator registers by default
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
)


def quick_start() -> list[str]:
    (block,) = [b for b in shell_blocks() if b.doc == DOC and "test_operator_quick_start.py" in (b.marker or "")]
    return block.commands()


def kubectl_apply(k8s: EmulatorHandle, files: list[str]) -> None:
    for name in files:
        for obj in (d for d in yaml.safe_load_all((ROOT / name).read_text()) if d):
            if obj["kind"] == "CustomResourceDefinition":
                k8s.emulator.register(kind_from_crd(obj))
            namespace = obj["metadata"].get("namespace")
            assert namespace is None or k8s.get("v1", "namespaces", namespace), (
                f"{name}: {obj['kind']} {obj['metadata']['name']}: namespaces \"{namespace}\" not found "
                "(a step of the quick start must create it first)")
            k8s.create(obj)


def pods_would_be_admitted(k8s: EmulatorHandle, deployment: dict[str, Any]) -> None:
    spec = deployment["spec"]["template"]["spec"]
    if spec.get("priorityClassName"):
        assert k8s.get("scheduling.k8s.io/v1", "priorityclasses", spec["priorityClassName"]), (
            f"pods name the PriorityClass {spec['priorityClassName']!r}, which no step of the quick start creates")


def test_the_quick_start_works_from_an_empty_cluster_in_the_order_written(tmp_path: Path) -> None:
    commands = quick_start()
    with serve(tmp_path, namespaces=("default",)) as k8s:
        for kind in CLUSTER_KINDS:
            k8s.emulator.register(kind)
        with _Operator(k8s, tmp_path) as operator:
            applied_model = None
            for command in commands:
                words = shlex.split(command.rstrip("&").strip())
                if words[:3] == ["kubectl", "create", "namespace"]:
                    k8s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": words[3]}})
                elif words[:2] == ["kubectl", "apply"]:
                    files = [words[i + 1] for i, w in enumerate(words) if w == "-f"]
                    kubectl_apply(k8s, files)
                    applied_model = next((f for f in files if f.startswith("examples/")), applied_model)
                elif words[0].endswith("flotilla-operator"):
                    operator.start(words[1:])
                elif words[:2] == ["kubectl", "get"]:
                    assert words[2] in ("im", "inferencemodels"), command
                    assert k8s.list("flotilla.dev/v1alpha1", "inferencemodels"), "kubectl get im shows no model"
                else:
                    raise AssertionError(f"the quick start has a step this test cannot carry out: {command}")
            assert operator.started and applied_model, "the quick start neither starts the operator nor applies a model"
            model = yaml.safe_load((ROOT / applied_model).read_text())
            name, namespace = model["metadata"]["name"], model["metadata"].get("namespace", "default")
            deployment = k8s.eventually(lambda: k8s.get("apps/v1", "deployments", name, namespace), timeout_s=60,
                                        message=f"the operator creating Deployment {name}")
            pods_would_be_admitted(k8s, deployment)


class _Operator:
    """The operator started by the quick start's own line, stopped when the test ends."""

    def __init__(self, k8s: EmulatorHandle, tmp_path: Path) -> None:
        self.k8s, self.tmp_path, self.started, self._context = k8s, tmp_path, False, None

    def start(self, args: list[str]) -> None:
        scope = None if "--all-namespaces" in args or "-A" in args else "default"
        rest = [a for a in args if a not in ("--all-namespaces", "-A")]
        self._context = operator_process(self.k8s.kubeconfig, self.tmp_path, *rest, namespace=scope)
        self._context.__enter__()
        self.started = True

    def __enter__(self) -> _Operator:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)
