"""The Prometheus client against a real Prometheus scraping exporters this test serves, and its failures."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from flotilla_contract.metrics import GATEWAY_REQUESTS_HELD
from flotilla_operator import prometheus as p
from flotilla_operator.prometheus import PrometheusClient, PrometheusError
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target


class Exporter:
    """One fake replica: the three gauges flotilla-server exports, on its own port; with `by_class`
    ({class: (waiting, running)}) also the class gauges of a server that knows request classes."""

    def __init__(self, model: str, waiting: float, running: float, slots: float,
                 by_class: dict[str, tuple[float, float]] | None = None) -> None:
        self.registry = CollectorRegistry()
        for name, value in ((p.WAITING, waiting), (p.RUNNING, running), (p.SLOTS, slots)):
            Gauge(name, name, ["model"], registry=self.registry).labels(model=model).set(value)
        if by_class is not None:
            waiting_g = Gauge(p.WAITING_BY_CLASS, "w", ["model", "class"], registry=self.registry)
            running_g = Gauge(p.RUNNING_BY_CLASS, "r", ["model", "class"], registry=self.registry)
            for request_class, (w, r) in by_class.items():
                waiting_g.labels(model=model, **{"class": request_class}).set(w)
                running_g.labels(model=model, **{"class": request_class}).set(r)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GatewayExporter(Exporter):
    """One flotilla-gateway replica: requests it holds, by model and the model's namespace."""

    def __init__(self, held: dict[tuple[str, str], float]) -> None:
        self.registry = CollectorRegistry()
        gauge = Gauge(GATEWAY_REQUESTS_HELD, "held", ["model", "model_namespace"], registry=self.registry)
        for (namespace, model), value in held.items():
            gauge.labels(model=model, model_namespace=namespace).set(value)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)


@pytest.fixture(scope="module")
def scraped() -> Iterator[tuple[RealPrometheus, list[Exporter]]]:
    # m-0 knows request classes, m-1 is an older server without the class gauges; the batch work of
    # `other` and of m in namespace `elsewhere` must not count
    exporters = [Exporter("m", 5, 2, 2, {"interactive": (2, 1), "batch": (3, 1)}), Exporter("m", 3, 2, 2),
                 Exporter("other", 9, 1, 2, {"interactive": (0, 0), "batch": (9, 1)}),
                 Exporter("m", 7, 1, 2, {"interactive": (0, 0), "batch": (7, 1)}),
                 GatewayExporter({("ns", "m"): 2, ("elsewhere", "m"): 4}), GatewayExporter({("ns", "m"): 3})]
    try:
        with RealPrometheus() as prom:
            prom.set_targets([
                Target(f"127.0.0.1:{exporters[0].port}", {"namespace": "ns", "model": "m", "pod": "m-0"}),
                Target(f"127.0.0.1:{exporters[1].port}", {"namespace": "ns", "model": "m", "pod": "m-1"}),
                Target(f"127.0.0.1:{exporters[2].port}", {"namespace": "ns", "model": "other", "pod": "o-0"}),
                Target(f"127.0.0.1:{exporters[3].port}", {"namespace": "elsewhere", "model": "m", "pod": "m-0"}),
                *(Target(f"127.0.0.1:{e.port}", {"namespace": "flotilla-system", "pod": f"gateway-{i}"})
                  for i, e in enumerate(exporters[4:])),
            ])
            prom.wait_for("count(up == 1)", lambda v: v == 6)
            yield prom, exporters
    finally:
        for e in exporters:
            e.close()


async def test_pool_sums_one_model_in_one_namespace(scraped) -> None:
    prom, _ = scraped
    client = PrometheusClient(prom.url)
    try:
        sample = await client.pool("ns", "m")
    finally:
        await client.aclose()
    assert sample == p.PoolSample(waiting=8, running=4, slots=4, replicas_reporting=2, held=5,  # held: both gateways
                                  waiting_batch=3, running_batch=1)  # batch: m-0's only
    assert sample.slots_per_replica == 2


async def test_unknown_model_is_an_empty_pool_not_an_error(scraped) -> None:
    prom, _ = scraped
    client = PrometheusClient(prom.url)
    try:
        sample = await client.pool("ns", 'no"such\\model')  # quoting survives odd names
    finally:
        await client.aclose()
    assert sample == p.PoolSample(0, 0, 0, 0) and sample.slots_per_replica is None


async def test_bad_promql_is_a_query_error(scraped) -> None:
    prom, _ = scraped
    client = PrometheusClient(prom.url)
    try:
        with pytest.raises(PrometheusError, match="rejected the query") as info:
            await client.query("sum(")
    finally:
        await client.aclose()
    assert info.value.reason == p.QUERY_ERROR


async def test_not_prometheus_is_an_http_error(scraped) -> None:
    _, exporters = scraped
    client = PrometheusClient(f"http://127.0.0.1:{exporters[0].port}")  # answers, but not the query API
    try:
        with pytest.raises(PrometheusError, match="--prometheus-url") as info:
            await client.pool("ns", "m")
    finally:
        await client.aclose()
    assert info.value.reason == p.HTTP_ERROR


async def test_nothing_listening_is_unreachable() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(PrometheusError, match="cannot reach Prometheus") as info:
            await client.pool("ns", "m")
    finally:
        await client.aclose()
    assert info.value.reason == p.UNREACHABLE


async def test_silent_server_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection in the backlog, never answers
        client = PrometheusClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.3)
        try:
            with pytest.raises(PrometheusError, match=r"did not answer within 0\.3s") as info:
                await client.pool("ns", "m")
        finally:
            await client.aclose()
    assert info.value.reason == p.TIMEOUT


@pytest.mark.parametrize("body", [
    None, {"status": "error"}, {"status": "success", "data": {"resultType": "matrix", "result": []}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "1"]}]}},
])
def test_unexpected_answers_are_bad_responses(body) -> None:
    with pytest.raises(PrometheusError) as info:
        p.parse_pool(body)
    assert info.value.reason == p.BAD_RESPONSE


def test_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="--prometheus-url must start with http"):
        PrometheusClient("prometheus:9090")


async def test_outage_and_recovery() -> None:
    exporter = Exporter("m", 4, 2, 2)
    try:
        with RealPrometheus() as prom:
            prom.set_targets([Target(f"127.0.0.1:{exporter.port}", {"namespace": "ns", "model": "m"})])
            prom.wait_for("sum(flotilla_slots)", lambda v: v == 2)
            client = PrometheusClient(prom.url, timeout_s=2.0)
            try:
                prom.stop()
                with pytest.raises(PrometheusError) as info:
                    await client.pool("ns", "m")
                assert info.value.reason == p.UNREACHABLE
                prom.start()  # same port, same data directory
                prom.wait_for("sum(flotilla_slots)", lambda v: v == 2)
                assert (await client.pool("ns", "m")).waiting == 4
            finally:
                await client.aclose()
    finally:
        exporter.close()


def test_support_prometheus_reports_its_own_failures(tmp_path) -> None:
    prom = RealPrometheus(workdir=tmp_path)
    prom.config_file.write_text("scrape_configs: [{job_name: 1, nonsense: true}]\n")
    with pytest.raises(RuntimeError, match="prometheus exited"):
        prom.start()
    prom.close()
    assert not prom.running
    with pytest.raises(httpx.HTTPError):
        httpx.get(prom.url, timeout=0.5)
