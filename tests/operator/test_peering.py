"""Two operator replicas with kopf peering, as the chart runs them: one acts, the other stands by.

The peering CRDs and the peering object come from the chart (crds/kopf.dev_peerings.yaml and
templates/kopfpeering.yaml rendered by helm), the flags from its Deployment template. Each replica
draws its own priority at start, so they never tie.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.support.examples import ROOT, crd
from tests.support.k8s_emulator import serve
from tests.support.operator_process import OperatorProcess, start_operator
from tests.support.rbac import allows

# Not `serial`: the takeover waits on the lease's keep-alive to lapse (wall time, not CPU), measured at 10-15 s
# against the 30 s bound, and the rest is waits; `make test` runs it beside the other files

TAKEOVER_S = 30.0
WAIT_S = 20.0
IM = ("flotilla.dev/v1alpha1", "inferencemodels")
PEERING_CRDS = list(yaml.safe_load_all((ROOT / "crds" / "kopf.dev_peerings.yaml").read_text()))


def chart(*sets: str) -> list[dict]:
    out = subprocess.run(["helm", "template", "flotilla", str(ROOT / "charts" / "flotilla"), "--namespace", "flotilla-system",
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def peering_args(docs: list[dict]) -> list[str]:
    """The peering flags of the chart's operator container."""
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.startswith("--peering")]


def model(name: str) -> dict:
    return {"apiVersion": IM[0], "kind": "InferenceModel", "metadata": {"name": name, "namespace": "default"},
            "spec": {"model": {"name": name, "source": {"builtin": "tiny"}}}}


def priority(op: OperatorProcess) -> int | None:
    match = re.search(r"peering 'flotilla' with priority (\d+)", op.log())
    return int(match.group(1)) if match else None


def acting(op: OperatorProcess, since: int = 0) -> bool:
    """kopf's last word on peering in this log (from offset `since`) is that it resumed."""
    log = op.log()[since:]
    return log.rfind("Resuming operations after the pause") > log.rfind("Pausing operations")


@pytest.fixture
def pair(tmp_path: Path):
    docs = chart("operator.watchNamespaces={default}")
    peerings = [d for d in docs if d["kind"] in ("KopfPeering", "ClusterKopfPeering")]
    assert [(p["kind"], p["metadata"]["namespace"]) for p in peerings] == [("KopfPeering", "default")]
    args = peering_args(docs)
    assert args == ["--peering=flotilla", "--peering-lifetime-s=20"]
    with serve(tmp_path, crds=[crd(), *PEERING_CRDS]) as k8s:
        for peering in peerings:
            k8s.create(peering)
        ops = []
        try:
            for i in range(2):
                ops.append(start_operator(k8s.kubeconfig, tmp_path / f"operator-{i}.log", "--drift-interval-s", "2", *args))
            yield k8s, ops
        finally:
            for op in ops:
                op.stop()


def test_one_replica_acts_the_other_stands_by_and_takes_over_after_sigkill(pair):
    k8s, ops = pair
    k8s.eventually(lambda: all(priority(op) for op in ops), WAIT_S, message="both priorities logged")
    assert priority(ops[0]) != priority(ops[1])  # drawn at random per process: no tie
    active, standby = sorted(ops, key=priority, reverse=True)  # kopf's rule: the highest acts
    k8s.eventually(lambda: acting(active) and not acting(standby), WAIT_S,
                   message=f"one acting, one standing by: {[op.log()[-1500:] for op in ops]}")
    assert not any("Pausing all operators, including self" in op.log() for op in ops)  # no tie, no freeze

    k8s.create(model("one"))
    k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "one", "default"), WAIT_S, message="Deployment one")
    time.sleep(5)  # two drift ticks of whoever acts
    writes = Counter((e.verb, e.resource) for e in k8s.emulator.audit
                     if e.verb in ("create", "update") and e.resource in ("deployments", "services"))
    assert writes == {("create", "deployments"): 1, ("create", "services"): 1}, writes  # one set, no duplicates
    assert standby.healthy() and active.healthy()  # standing by is not a failure
    assert not acting(standby)

    log_at_kill = len(standby.log())
    active.kill()  # SIGKILL: no goodbye in the peering object; its keep-alive must lapse
    killed_s = time.monotonic()
    k8s.create(model("two"))
    k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "two", "default"), TAKEOVER_S + 5,
                   message="the standby acting after the active replica was killed")
    took_s = time.monotonic() - killed_s
    print(f"takeover after SIGKILL: {took_s:.1f}s")
    assert took_s < TAKEOVER_S
    assert acting(standby, since=log_at_kill)
    assert_peering_rbac(list(k8s.emulator.audit), "kopfpeerings")


def test_without_the_peering_object_liveness_fails_and_says_what_is_missing(tmp_path):
    (peering,) = [d for d in chart() if "Peering" in d["kind"]]  # all namespaces: one ClusterKopfPeering
    assert peering["kind"] == "ClusterKopfPeering"
    with serve(tmp_path, crds=[crd(), *PEERING_CRDS]) as k8s:
        op = start_operator(k8s.kubeconfig, tmp_path / "operator.log", *peering_args(chart()), namespace=None,
                            wait_healthy=False)
        try:
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline and "peering object missing" not in op.log():
                op.healthy()  # the probe runs when asked
                time.sleep(0.5)
            assert not op.healthy()
            assert 'ClusterKopfPeering "flotilla" does not exist' in op.log()
            k8s.create(peering)
            k8s.eventually(op.healthy, WAIT_S, interval_s=1.0, message="healthy once the object exists")
            k8s.create(model("late"))
            k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "late", "default"), WAIT_S, message="acting")
            audit = list(k8s.emulator.audit)
        finally:
            op.stop()
    assert_peering_rbac(audit, "clusterkopfpeerings")


def assert_peering_rbac(audit: list, resource: str) -> None:
    """Every kopf.dev verb the operator used is granted, and every one granted for `resource` was used."""
    rules = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole")["rules"]
    used = {(e.verb, e.group, e.resource) for e in audit if not e.user_agent.startswith("python-httpx")}
    assert [u for u in used if not allows(rules, *u)] == []
    granted = {(verb, "kopf.dev", resource) for rule in rules if "kopf.dev" in rule["apiGroups"]
               and resource in rule["resources"] for verb in rule["verbs"]}
    assert granted and granted <= used, granted - used


def test_standalone_runs_one_replica_without_peering_objects(tmp_path):
    docs = chart("operator.peering.enabled=false", "replicaCount=1")
    assert peering_args(docs) == [] and not [d for d in docs if "Peering" in d["kind"]]
    with serve(tmp_path, crds=[crd()]) as k8s:
        op = start_operator(k8s.kubeconfig, tmp_path / "operator.log")
        try:
            k8s.create(model("solo"))
            k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "solo", "default"), WAIT_S, message="Deployment")
            assert op.healthy()
        finally:
            op.stop()
