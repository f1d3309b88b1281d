"""deploy/*.yaml (RBAC, priority classes) are valid for Kubernetes 1.30 and 1.37 and match the placement policies."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from flotilla_operator.placement import PRIORITY_CLASS

from tests.support.examples import ROOT

DEPLOY = sorted((ROOT / "deploy").glob("*.yaml"))


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("path", DEPLOY, ids=lambda p: p.name)
def test_deploy_manifests_pass_kubernetes_validate_strict(path, version):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, version, strict=True)


def test_priority_classes_exist_for_both_policies_in_order():
    classes = {d["metadata"]["name"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "priorityclasses.yaml").read_text())}
    latency, cost = classes[PRIORITY_CLASS["latency-first"]], classes[PRIORITY_CLASS["cost-first"]]
    assert latency["value"] > cost["value"]
    assert cost["preemptionPolicy"] == "Never" and not latency["globalDefault"] and not cost["globalDefault"]
