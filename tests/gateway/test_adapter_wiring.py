"""The gateway's adapter wiring over a board of fake load reports: which model serves each adapter
(adapter_index.adapter_bases), GET /v1/models' union, and the proxy's pick (adapter_routing.choose_for_adapter
fed from the board): a hot adapter spreads to a second pod under load, a new pod takes adapter traffic, a pod
that does not serve the adapter never gets it; an old server's report (no adapter fields) still parses."""

from __future__ import annotations

import time

import pytest
from flotilla_contract.load import AdapterServed, ModelLoad, ServerLoad
from flotilla_gateway.adapter_index import adapter_bases, model_cards
from flotilla_gateway.adapter_routing import SPREAD_LOAD
from flotilla_gateway.load_board import LoadBoard
from flotilla_gateway.metrics import MAX_ADAPTER_LABELS, GatewayMetrics
from flotilla_gateway.proxy import Proxy
from flotilla_gateway.route_map import ModelRoute

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def route(name: str, pods: tuple[str, ...], created: str = "2024-01-01T00:00:00Z", **extra) -> ModelRoute:
    return ModelRoute(name=name, namespace="default", resource=name, created=created, pods=pods, replicas=len(pods),
                      **extra)


@pytest.mark.parametrize(("routes", "reported", "before", "expected"), [
    pytest.param({"llama": route("llama", (A, B))}, {A: [("legal", "llama")], B: [("legal", "llama"), ("sql", "llama")]},
                 {}, {"legal": "llama", "sql": "llama"}, id="union-of-the-pods"),
    pytest.param({"llama": route("llama", ())}, {}, {"legal": "llama"}, {"legal": "llama"},
                 id="no-pod-reports-keeps-what-it-had"),
    pytest.param({"llama": route("llama", (A,))}, {A: [("sql", "llama")]}, {"legal": "llama"}, {"sql": "llama"},
                 id="a-report-replaces-it"),
    pytest.param({}, {}, {"legal": "llama"}, {}, id="model-gone"),
    pytest.param({"llama": route("llama", (A,)), "legal": route("legal", (B,))}, {A: [("legal", "llama")]}, {},
                 {}, id="a-model-name-stays-the-model-s"),
    pytest.param({"new": route("new", (A,), created="2025-01-01T00:00:00Z"), "old": route("old", (B,))},
                 {A: [("legal", "new")], B: [("legal", "old")]}, {}, {"legal": "old"}, id="two-models-older-wins"),
    pytest.param({"llama": route("llama", (A,), pool="p"), "qwen": route("qwen", (A,), pool="p")},
                 {A: [("legal", "llama"), ("code", "qwen")]}, {}, {"legal": "llama", "code": "qwen"},
                 id="a-pool-pod-s-bases"),
    pytest.param({"llama": route("llama", (A,))}, {A: [("x", "other")], C: [("y", "llama")]}, {}, {},
                 id="another-base-or-another-model-s-pod"),
])
def test_adapter_bases(routes, reported, before, expected):
    assert adapter_bases(routes, reported, before) == expected


def test_models_lists_each_model_and_adapter_once():
    routes = {"llama": route("llama", (A, B)), "qwen": route("qwen", (C,))}
    adapters = adapter_bases(routes, {A: [("legal", "llama")], B: [("legal", "llama")], C: [("legal", "qwen"),
                                                                                         ("code", "qwen")]}, {})
    cards = model_cards(routes, adapters)
    assert [(c["id"], c.get("parent")) for c in cards] == [("llama", None), ("qwen", None), ("code", "qwen"),
                                                           ("legal", "llama")]


def report(*, served: tuple[str, ...] = (), resident: tuple[str, ...] = (), free: int = 0, max_loras: int = 4,
           base: str = "llama") -> ServerLoad:
    return ServerLoad(ready=True, waiting=0, running=0, slots=16, queue_capacity=128, kv_usage=0.1,
                      models=[ModelLoad(name=base, max_loras=max_loras, adapter_slots_free=free)],
                      adapters=[AdapterServed(name=n, base=base) for n in served], adapters_resident=list(resident),
                      max_loras=max_loras, adapter_slots_free=free)


class Board:
    """A LoadBoard with fresh fake reports, and the proxy's pick as a request would make it."""

    def __init__(self, reports: dict[str, ServerLoad]) -> None:
        self.board = LoadBoard()
        self.proxy = Proxy(None, self.board, GatewayMetrics(), lambda: None)  # type: ignore[arg-type]
        for address, load in reports.items():
            self.set(address, load)

    def set(self, address: str, load: ServerLoad) -> None:
        self.board.reports[address] = (load, time.monotonic())

    def send(self, model: ModelRoute, adapter: str) -> str:
        """Picks a pod as Proxy.forward does, and leaves the request in flight there."""
        address = self.proxy._pick(model, "key", "name", "least-load", set(), adapter)
        assert address is not None
        self.board.in_flight[address] = self.board.in_flight.get(address, 0) + 1
        self.board.adapter_sent(adapter, address)
        return address


def test_a_hot_adapter_spreads_to_a_second_pod_under_load_and_only_to_pods_that_serve_it():
    llama = route("llama", (A, B, C))
    board = Board({A: report(served=("legal",), resident=("legal",), free=3),
                   B: report(served=("legal",), free=4), C: report(free=4)})  # C serves no adapter
    sent = [board.send(llama, "legal") for _ in range(SPREAD_LOAD)]
    assert sent == [A] * SPREAD_LOAD  # cold: one pod, the holder
    assert board.send(llama, "legal") == B  # in flight past SPREAD_LOAD: a second pod
    assert C not in {board.send(llama, "legal") for _ in range(2 * SPREAD_LOAD)}
    assert board.board.adapter_holders("legal") == {A, B}  # B by the send, before its report says so


def test_a_new_pod_takes_adapter_traffic():
    llama = route("llama", (A, B))
    board = Board({A: report(served=("legal", "sql", "code"), resident=("legal",), free=0),
                   B: report(served=("legal", "sql", "code"), resident=("sql",), free=0)})
    for _ in range(SPREAD_LOAD):
        board.send(llama, "legal")
    grown = route("llama", (A, B, C))  # a scale-up: C reports every slot free
    board.set(C, report(served=("legal", "sql", "code"), free=4))
    assert board.send(grown, "legal") == C  # the hot adapter's second pod: the one with free slots
    assert board.send(grown, "code") == C  # a cold adapter no pod holds goes where slots are free


def test_a_finished_request_leaves_the_adapter_s_load():
    board = Board({A: report(served=("legal",), free=4)})
    board.send(route("llama", (A,)), "legal")
    assert board.board.adapter_in_flight == {"legal": 1}
    board.proxy._release(A, "legal")
    assert board.board.adapter_in_flight == {} and board.board.in_flight == {}


def test_an_old_server_s_report_parses_without_adapters():
    old = ServerLoad.model_validate_json(b'{"ready": true, "waiting": 0, "running": 1, "slots": 4, '
                                         b'"queue_capacity": 32, "kv_usage": 0.5, "models": [{"name": "m"}]}')
    assert (old.adapters, old.adapters_resident, old.max_loras, old.adapter_slots_free, old.adapters_refused) == \
        ([], [], 0, 0, [])
    assert old.models[0].adapter_slots_free == 0


def test_adapter_labels_are_bounded_then_count_under_their_model():
    metrics = GatewayMetrics()
    assert metrics.model_label("llama", None) == "llama"
    labels = [metrics.model_label(f"a{i}", "llama") for i in range(MAX_ADAPTER_LABELS + 2)]
    assert labels[:MAX_ADAPTER_LABELS] == [f"a{i}" for i in range(MAX_ADAPTER_LABELS)]
    assert labels[MAX_ADAPTER_LABELS:] == ["llama", "llama"] and metrics.model_label("a0", "llama") == "a0"
