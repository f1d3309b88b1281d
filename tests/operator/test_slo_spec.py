"""spec.slo as the API server admits it and as the operator reads it: good targets defaulted, bad ones refused.

The CRD schema refuses a target of 0 or below, a percentile outside (0, 1), an empty slo and an slo on a
pooled cost-first model, each naming the field; the pydantic types refuse the same for specs that never
passed the API server (Degraded, InvalidSpec). What the schema cannot know (the window against Prometheus'
scrape interval) is the autoscaler's hold SloNotMeasured, shown in tests/operator/test_slo_loop.py.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from flotilla_operator import slo_status, types

from tests.support.crd_schema import admit
from tests.support.examples import crd_schema


def _model(slo: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": "m", "namespace": "default"},
            "spec": {"model": {"name": "m", "source": {"builtin": "tiny"}}, **({"slo": slo} if slo is not None else {}),
                     **spec}}


def test_a_ttft_target_alone_is_admitted_with_its_defaults() -> None:
    stored, errors = admit(crd_schema(), _model({"ttftSeconds": 0.5}))
    assert errors == []
    assert stored["spec"]["slo"] == {"ttftSeconds": 0.5, "ttftPercentile": 0.9, "tpotPercentile": 0.9,
                                     "windowSeconds": 60}
    targets = slo_status.slo_targets(types.parse_spec(stored["spec"]))
    assert (targets.ttft_s, targets.tpot_s, targets.ttft_percentile, targets.window_s) == (0.5, None, 0.9, 60.0)
    assert types.parse_spec(stored["spec"]) == types.parse_spec(_model({"ttftSeconds": 0.5})["spec"])


def test_both_targets_at_their_own_percentiles_are_admitted() -> None:
    slo = {"ttftSeconds": 2, "ttftPercentile": 0.99, "tpotSeconds": 0.05, "tpotPercentile": 0.5, "windowSeconds": 30}
    stored, errors = admit(crd_schema(), _model(slo))
    assert errors == [] and stored["spec"]["slo"] == slo
    assert types.parse_spec(_model(None)["spec"]).slo is None  # no slo: queue depth alone, as before


INVALID = [
    ("zero TTFT target", {"ttftSeconds": 0}, "spec.slo.ttftSeconds: 0 is less than or equal to the minimum of 0"),
    ("negative TTFT target", {"ttftSeconds": -0.5}, "spec.slo.ttftSeconds: -0.5 is less than or equal to the minimum"),
    ("zero TPOT target", {"tpotSeconds": 0}, "spec.slo.tpotSeconds: 0 is less than or equal to the minimum of 0"),
    ("negative TPOT target", {"tpotSeconds": -1}, "spec.slo.tpotSeconds: -1 is less than or equal to the minimum"),
    ("percentile of 0", {"ttftSeconds": 1, "ttftPercentile": 0},
     "spec.slo.ttftPercentile: 0 is less than or equal to the minimum of 0"),
    ("percentile of 1", {"ttftSeconds": 1, "ttftPercentile": 1},
     "spec.slo.ttftPercentile: 1 is greater than or equal to the maximum of 1"),
    ("percentile as a percent", {"tpotSeconds": 0.1, "tpotPercentile": 90},
     "spec.slo.tpotPercentile: 90 is greater than or equal to the maximum of 1"),
    ("negative percentile", {"tpotSeconds": 0.1, "tpotPercentile": -0.1},
     "spec.slo.tpotPercentile: -0.1 is less than or equal to the minimum of 0"),
    ("TTFT past the histogram's top bucket", {"ttftSeconds": 120},
     "spec.slo.ttftSeconds: 120 is greater than the maximum of 60"),
    ("no target at all", {"windowSeconds": 30},
     "spec.slo: slo must set ttftSeconds, tpotSeconds or both; remove slo to scale on queue depth alone"),
    ("a window under two seconds", {"ttftSeconds": 1, "windowSeconds": 1},
     "spec.slo.windowSeconds: 1 is less than the minimum of 2"),
]


@pytest.mark.parametrize(("case", "slo", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_the_crd_refuses_a_bad_slo_and_names_the_field(case: str, slo: dict[str, Any], message: str) -> None:
    _, errors = admit(crd_schema(), _model(slo))
    assert any(message in error for error in errors), f"{case}: got {errors}"


@pytest.mark.parametrize(("case", "slo", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_the_operator_refuses_the_same_where_the_api_server_did_not_check(case: str, slo: dict[str, Any],
                                                                          message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        types.parse_spec(_model(slo)["spec"])
    error = refused.value.errors()[0]
    assert error["loc"][0] == "slo", f"{case}: {error}"


def test_an_slo_on_a_pooled_cost_first_model_is_refused() -> None:
    obj = _model({"ttftSeconds": 1}, placement={"policy": "cost-first"}, pool="shared",
                 scaling={"minReplicas": 0})
    message = "slo needs the model's own Deployment: a cost-first model that names a pool is scaled by its ModelPool"
    assert any(message in error for error in admit(crd_schema(), obj)[1])
    with pytest.raises(pydantic.ValidationError, match="slo needs the model's own Deployment"):
        types.parse_spec(obj["spec"])
    obj["spec"]["placement"]["policy"] = "latency-first"  # a latency-first model keeps its own Deployment
    obj["spec"]["scaling"]["minReplicas"] = 1
    assert admit(crd_schema(), obj)[1] == []



async def test_a_bad_slo_that_bypassed_the_schema_is_degraded_naming_the_field(tmp_path) -> None:
    """A CRD whose schema did not check spec.slo (here: an slo object with no constraints) lets a zero target
    through; the operator then marks the model Degraded, reason InvalidSpec, naming the field."""
    import copy
    import functools
    import logging

    import yaml
    from flotilla_operator import credentials
    from flotilla_operator.kube import KubeClient
    from flotilla_operator.reconciler import Context, reconcile
    from flotilla_operator.settings import OperatorSettings

    from tests.support.examples import ROOT
    from tests.support.k8s_emulator import serve

    crd = yaml.safe_load((ROOT / "crds" / "flotilla.dev_inferencemodels.yaml").read_text())
    lax = copy.deepcopy(crd)
    spec_schema = lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["slo"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    spec_schema["x-kubernetes-validations"] = [r for r in spec_schema["x-kubernetes-validations"] if "slo" not in r["rule"]]
    with serve(tmp_path, crds=[lax]) as k8s:
        stored = k8s.create(_model({"ttftSeconds": 0}))
        kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
        try:
            await reconcile(Context(OperatorSettings(namespaces=("default",)), kube, monitoring=False), stored,
                            logging.getLogger("test"))
        finally:
            await kube.close()
        obj = k8s.get(types.API_VERSION, types.PLURAL, "m", "default")
        degraded = next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
        assert "slo.ttftSeconds" in degraded["message"] and "greater than 0" in degraded["message"], degraded
        assert k8s.get("apps/v1", "deployments", "m", "default") is None  # nothing is run from a spec it cannot read
