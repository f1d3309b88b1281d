"""helm lint --strict and helm template on the chart: what each value turns into, and the errors users can cause."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.chart.render import ALL_OPTIONS, CHART, NAMESPACE, by_kind, helm, one, render, template_args

REPO_ROOT = CHART.parents[1]


@pytest.mark.parametrize("values_name", ["default", "all-options"])
def test_helm_lint_strict_passes(values_name: str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if values_name == "all-options":
        args += ["-f", str(ALL_OPTIONS)]
    result = helm(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_default_values_render_operator_rbac_priority_classes_and_dashboards() -> None:
    kinds = sorted(d["kind"] for d in render("default"))
    assert kinds == ["ClusterKopfPeering", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
                     "ConfigMap", "ConfigMap", "ConfigMap", *["CustomResourceDefinition"] * 4, "Deployment", "Deployment",
                     "PodDisruptionBudget", "PriorityClass", "PriorityClass", "Service", "Service", "ServiceAccount",
                     "ServiceAccount"]
    # the operator's and the gateway's; three dashboards; CRDs: InferenceModel, ModelPool and kopf's two peering
    # kinds; the gateway's disruption budget (two replicas by default)


def test_the_gateway_rolls_out_and_drains_without_a_gap() -> None:
    docs = render("default")
    (gateway,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["labels"].get("app.kubernetes.io/component")
                  == "gateway"]
    assert gateway["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = gateway["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--drain-delay-s=5" in args and "--drain-timeout-s=30" in args and "--rate-limit-replicas=2" in args
    assert pod["terminationGracePeriodSeconds"] == 5 + 30 + 5  # the delay, the drain, and a margin
    (budget,) = by_kind(docs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]


def test_priority_classes_carry_the_names_the_operator_uses() -> None:
    from flotilla_operator.placement import PRIORITY_CLASS

    classes = {pc["metadata"]["name"]: pc for pc in by_kind(render("default"), "PriorityClass")}
    assert set(classes) == set(PRIORITY_CLASS.values())
    assert classes["flotilla-latency-first"]["value"] > classes["flotilla-cost-first"]["value"]
    assert classes["flotilla-cost-first"]["preemptionPolicy"] == "Never"
    source = {d["metadata"]["name"]: d for d in yaml.safe_load_all((REPO_ROOT / "deploy" / "priorityclasses.yaml").read_text())}
    for name, pc in classes.items():
        for key in ("value", "globalDefault", "preemptionPolicy", "description"):
            assert pc.get(key) == source[name].get(key), f"{name}.{key} differs from deploy/priorityclasses.yaml"
    assert not by_kind(render("default", "priorityClasses.create=false"), "PriorityClass")


def test_all_options_render_every_optional_resource() -> None:
    kinds = sorted(d["kind"] for d in render("all-options"))
    assert kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
                     *["ConfigMap"] * 3, *["CustomResourceDefinition"] * 4, "Deployment", "Deployment", "KopfPeering", "KopfPeering",
                     "PodDisruptionBudget", "PodMonitor", "PriorityClass", "PriorityClass", "PrometheusRule", "Service",
                     "Service",
                     "ServiceAccount", "ServiceAccount", "ServiceMonitor"]


def test_peering_objects_follow_the_watched_namespaces() -> None:
    peerings = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in render("all-options")
                if "Peering" in d["kind"]]
    assert peerings == [("KopfPeering", "team-a", "flotilla-ha"), ("KopfPeering", "team-b", "flotilla-ha")]
    default = [(d["kind"], d["metadata"]["name"]) for d in render("default") if "Peering" in d["kind"]]
    assert default == [("ClusterKopfPeering", "flotilla")]  # all namespaces: one cluster-wide object
    standalone = render("default", "operator.peering.enabled=false", "replicaCount=1")
    assert not [d for d in standalone if "Peering" in d["kind"]]
    assert "--standalone" in container(standalone)["args"]
    assert one(standalone, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def container(docs: tuple[dict, ...]) -> dict:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_default_operator_flags_watch_all_namespaces_with_peering() -> None:
    assert one(render("default"), "Deployment")["spec"]["replicas"] == 2
    assert container(render("default"))["args"] == [
        "--all-namespaces",
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
        "--default-image=ghcr.io/flotilla-dev/flotilla-server:0.1.0",
        "--autoscale-interval-s=15",
        "--peering=flotilla",
        "--peering-lifetime-s=20",
        "--health-port=8081",
        "--metrics-port=8080",
    ]


def test_values_become_operator_flags() -> None:
    c = container(render("all-options"))
    assert c["args"] == [
        "--namespace=team-a",
        "--namespace=team-b",
        "--prometheus-url=http://kube-prometheus-stack-prometheus.monitoring.svc:9090",
        "--default-image=registry.example.com/flotilla/flotilla-server:0.1.0",
        "--autoscale-interval-s=10",
        "--peering=flotilla-ha",
        "--peering-lifetime-s=15",
        "--verbose",
        "--health-port=9081",
        "--metrics-port=9080",
        "--drift-interval-s=30",
    ]
    assert c["image"].startswith("registry.example.com/flotilla/flotilla-operator@sha256:")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9080, "health": 9081}


def test_operator_flags_parse_with_the_real_cli() -> None:
    from flotilla_operator.cli import build_parser, settings_from_args

    for values_name in ("default", "all-options"):
        settings = settings_from_args(build_parser().parse_args(container(render(values_name))["args"]))
        assert settings.metrics_port in (8080, 9080)


def test_default_image_is_the_chart_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(render("default"))["image"] == f"ghcr.io/flotilla-dev/flotilla-operator:{app_version}"


def test_operator_runs_non_root_read_only_without_privileges() -> None:
    deployment = one(render("default"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(render("default"))["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert container(render("default"))["resources"]["limits"]["memory"]
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}  # peering: a standby may overlap


def test_recommended_labels_on_every_chart_resource() -> None:
    for doc in render("all-options"):
        if doc["kind"] == "CustomResourceDefinition":
            continue  # crds/ is copied verbatim, never templated
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/component", "app.kubernetes.io/managed-by", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']}/{doc['metadata']['name']} lacks label {key}"


def test_dashboards_are_configmaps_with_configurable_label() -> None:
    default = by_kind(render("default"), "ConfigMap")
    assert all(cm["metadata"]["labels"]["grafana_dashboard"] == "1" for cm in default)
    relabelled = by_kind(render("default", "dashboards.labelKey=team/dashboard", "dashboards.labelValue=yes"),
                         "ConfigMap")
    assert all(cm["metadata"]["labels"]["team/dashboard"] == "yes" for cm in relabelled)
    uids = set()
    for cm in default:
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((REPO_ROOT / "dashboards" / name).read_text())
        uids.add(json.loads(text)["uid"])
    assert uids == {"flotilla-fleet", "flotilla-model", "flotilla-pool"}
    assert not by_kind(render("default", "dashboards.enabled=false"), "ConfigMap")


def test_cluster_role_binding_names_the_operator_service_account() -> None:
    docs = render("all-options")
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "flotilla-operator", "namespace": NAMESPACE}]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "flotilla-operator"


def test_service_monitor_honours_the_operator_namespace_label() -> None:
    (endpoint,) = one(render("all-options"), "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"


def test_pod_monitor_follows_watched_namespaces() -> None:
    spec = one(render("all-options"), "PodMonitor")["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    spec = one(render("default", "podMonitor.enabled=true"), "PodMonitor")["spec"]
    assert spec["namespaceSelector"] == {"any": True}


def test_prometheus_rule_is_the_alert_file_verbatim_then_the_class_slos() -> None:
    rule = one(render("all-options"), "PrometheusRule")
    source = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    *groups, slos = rule["spec"]["groups"]
    assert {**rule["spec"], "groups": groups} == source
    assert slos["name"] == "flotilla.class-slos"
    assert {r["labels"]["class"]: r["expr"] for r in slos["rules"]} == {"interactive": "vector(0.5)", "batch": "vector(600)"}
    assert {r["record"] for r in slos["rules"]} == {"flotilla:class_queue_wait_slo_seconds"}
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    no_slos = one(render("default", "prometheusRule.enabled=true", "prometheusRule.classQueueWaitSLOSeconds=null"),
                  "PrometheusRule", component="alerts")
    assert no_slos["spec"] == source  # no SLOs: no group, and FlotillaClassQueueWaitHigh never fires


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["operator.peering.enabled=false"], "replicaCount > 1 needs operator.peering.enabled=true"),
        (["serviceAccount.create=false"], "serviceAccount.name is required when serviceAccount.create is false"),
        (["operator.prometheusUrl="], "at '/operator/prometheusUrl': '' does not match pattern '^https?://'"),
        (["operator.promethusUrl=http://p:9090"], "at '/operator': additional properties 'promethusUrl' not allowed"),
        (["replicaCount=two"], "at '/replicaCount': got string, want integer"),
        (["image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
    ],
)
def test_user_errors_say_what_to_change(sets: list[str], message: str) -> None:
    result = helm(*template_args(None, *sets), check=False)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.37.0"])
def test_renders_for_supported_kubernetes_versions(kube_version: str) -> None:
    helm(*template_args(None), "--kube-version", kube_version)


def test_refuses_kubernetes_older_than_1_30() -> None:
    result = helm(*template_args(None), "--kube-version", "1.29.0", check=False)
    assert result.returncode != 0 and "kubeVersion" in result.stderr


@pytest.mark.parametrize("values_name", ["default", "all-options"])
def test_gateway_flags_parse_with_the_real_cli(values_name: str) -> None:
    from flotilla_gateway.cli import parser

    docs = render(values_name)
    deployment = one(docs, "Deployment", component="gateway")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["flotilla-gateway"]
    args = parser().parse_args(container["args"])
    assert args.in_cluster and args.port == container["ports"][0]["containerPort"]
    assert pod["terminationGracePeriodSeconds"] > args.drain_timeout_s  # streams in flight finish first
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = one(docs, "Service", component="gateway")
    assert service["spec"]["ports"][0]["port"] == args.port
    binding = one(docs, "ClusterRoleBinding", component="gateway")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    if values_name == "all-options":
        assert deployment["spec"]["replicas"] == 3 and args.namespaces == ["team-a", "team-b"]
        assert args.api_keys_file == "/etc/flotilla-gateway/keys/keys.yaml"
        assert {"name": "keys", "secret": {"secretName": "flotilla-gateway-keys"}} in pod["volumes"]
        assert container["image"] == "registry.example.com/flotilla/flotilla-gateway:0.1.0-rc1"
    else:
        assert deployment["spec"]["replicas"] == 2 and args.namespaces is None and args.api_keys_file is None
        assert container["image"] == one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
