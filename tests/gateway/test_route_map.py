"""build_routes: InferenceModels and EndpointSlices to routes, as a table of cluster states."""

from __future__ import annotations

from typing import Any

from flotilla_gateway.route_map import DEFAULT_MAX_HELD, DEFAULT_MAX_WAIT_S, build_routes, ready_endpoints


def model(name: str, served: str | None = None, ns: str = "default", created: str = "2026-01-01T00:00:00Z",
          **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created, "generation": 2},
            "spec": {"model": {"name": served or name}, **spec}}


def endpoint_slice(service: str, *endpoints: tuple[str, bool | None], ns: str = "default", port: int = 8000,
                   port_name: str = "http") -> dict[str, Any]:
    return {"metadata": {"name": f"{service}-x", "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": port_name, "port": port}],
            "endpoints": [{"addresses": [a], **({"conditions": {"ready": r}} if r is not None else {})}
                          for a, r in endpoints]}


def test_defaults_and_spec_fields() -> None:
    routes = build_routes([model("a"), model("b", "llama", replicas=0, scaling={"disabled": True},
                                             routing={"policy": "prefix"},
                                             coldStart={"maxHeld": 5, "maxWaitSeconds": 3})], [])
    a, b = routes["a"], routes["llama"]
    assert (a.max_held, a.max_wait_s, a.policy, a.replicas, a.scaling_disabled, a.pods) == (
        DEFAULT_MAX_HELD, DEFAULT_MAX_WAIT_S, None, None, False, ())
    assert (b.resource, b.max_held, b.max_wait_s, b.policy, b.replicas, b.scaling_disabled, b.generation) == (
        "b", 5, 3.0, "prefix", 0, True, 2)


def test_ready_endpoints_of_the_models_service_only() -> None:
    slices = [endpoint_slice("a", ("127.0.0.2", True), ("127.0.0.3", None), ("127.0.0.4", False)),
              endpoint_slice("a", ("127.0.0.5", True), ns="other"),  # same Service name, other namespace
              endpoint_slice("b", ("127.0.0.6", True))]
    routes = build_routes([model("a")], slices)
    assert routes["a"].pods == ("127.0.0.2:8000", "127.0.0.3:8000")  # no ready condition means ready


def test_port_named_http_else_first_and_ipv6() -> None:
    s = endpoint_slice("a", ("fd00::1", True), port_name="metrics")
    s["ports"].insert(0, {"name": "other", "port": 9})
    assert ready_endpoints(s) == ["[fd00::1]:9"]
    s["ports"].append({"name": "http", "port": 8000})
    assert ready_endpoints(s) == ["[fd00::1]:8000"]
    assert ready_endpoints({"endpoints": [{"addresses": ["1.2.3.4"]}]}) == []  # no port: no endpoint


def test_degraded_message() -> None:
    m = model("a")
    m["status"] = {"conditions": [{"type": "Degraded", "status": "True", "reason": "ClaimNotFound",
                                   "message": "PVC models is missing"}, {"type": "Ready", "status": "False"}]}
    assert build_routes([m], [])["a"].degraded == "ClaimNotFound: PVC models is missing"
    m["status"]["conditions"][0]["status"] = "False"
    assert build_routes([m], [])["a"].degraded is None


def test_one_name_in_two_namespaces_goes_to_the_older() -> None:
    old = model("x", "llama", ns="team-b", created="2026-01-01T00:00:00Z")
    new = model("x", "llama", ns="team-a", created="2026-02-01T00:00:00Z")
    for order in ([old, new], [new, old]):
        assert build_routes(order, [])["llama"].namespace == "team-b"
    gone = {**old, "metadata": {**old["metadata"], "deletionTimestamp": "2026-03-01T00:00:00Z"}}
    assert build_routes([gone, new], [])["llama"].namespace == "team-a"  # a deleted one gives the name up


def pool(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "generation": 7}, "spec": spec}


def joined(m: dict[str, Any], pool_name: str) -> dict[str, Any]:
    return {**m, "status": {"pool": pool_name}}


def test_a_pooled_model_routes_to_its_pools_pods_and_scales_with_the_pool() -> None:
    slices = [endpoint_slice("shared-pool", ("127.0.0.2", True), ("127.0.0.3", True)),
              endpoint_slice("m", ("127.0.0.9", True))]  # the member's own Service: not where the gateway looks
    member = joined(model("m", "llama", replicas=3, coldStart={"maxHeld": 5}), "shared")
    routes = build_routes([member, model("solo", pool="shared")], slices,
                          [pool("shared", replicas=0, scaling={"disabled": True, "targetQueueDepth": 0})])
    m = routes["llama"]
    assert (m.pool, m.pods, m.replicas, m.generation, m.scaling_disabled, m.target_waiting, m.max_held) == (
        "shared", ("127.0.0.2:8000", "127.0.0.3:8000"), 0, 7, True, 0.0, 5)
    assert m.scaled_by == ("ModelPool", "shared")
    solo = routes["solo"]  # spec.pool alone is not membership: the operator's status.pool says it joined
    assert (solo.pool, solo.scaled_by) == (None, ("InferenceModel", "solo"))


def test_a_member_whose_pool_is_not_seen_is_known_with_no_replicas() -> None:
    routes = build_routes([joined(model("m"), "gone")], [], [pool("gone", ns="other", replicas=0)])
    assert (routes["m"].pool, routes["m"].replicas, routes["m"].pods) == ("gone", None, ())


def test_the_gateways_target_default_is_the_crds() -> None:
    from flotilla_gateway.route_map import DEFAULT_POOL_TARGET_WAITING
    from flotilla_operator.pool_types import PoolScalingSpec

    assert PoolScalingSpec().target_queue_depth == DEFAULT_POOL_TARGET_WAITING
    assert build_routes([joined(model("m"), "p")], [], [pool("p")])["m"].target_waiting == DEFAULT_POOL_TARGET_WAITING
