"""Every panel query of the fleet and model dashboards returns data from a real system under load.

The whole loop runs for real: the operator (subprocess) against the Kubernetes API emulator, the pod
runner starting `flotilla-server --model tiny` processes for its Deployment, a real flotilla-gateway in
front of them, a real Prometheus scraping the servers, the gateway and the operator, and a load generator
that overloads the model through the gateway (429s) while some clients walk away mid-stream (499s). The
model starts at zero replicas, so the gateway's first requests are held and wake it (the hold panels). Each query is then evaluated the way Grafana would for one
selection of the dashboard's variables (variable queries included); a query that errors or returns no
finite value fails the test, named by dashboard, panel and refId. (The pool dashboard's series come from
multi-model servers: tests/server/model_cache/test_multimodel_server.py evaluates it against one.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.conftest import SERVER_START_S, SETTLE_S
from e2e.load import LoadGenerator
from e2e.pod_runner import PodRunner
from tests.chart.dashboard_queries import load_dashboards
from tests.support.dashboard_eval import WINDOW_S, failing_queries
from tests.support.gateway_cluster import gateway_process
from tests.support.k8s_emulator import serve
from tests.support.operator_process import operator_process
from tests.support.prometheus import RealPrometheus, Target

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
MODEL = "tiny"
DATA_TIMEOUT_S = 60  # how long the system may take to produce a series for every panel, once a replica serves
READY_TIMEOUT_S = SERVER_START_S  # operator, Deployment and a server process starting on a shared machine
# Panels whose series this load must move, not merely create (every rejection reason starts at 0).
MUST_BE_NONZERO = {"429/s by reason", "499/s by reason", "Output tokens/s"}
DASHBOARDS = ("flotilla-fleet.json", "flotilla-model.json")

# Small engine, short queue: a dozen concurrent clients overflow it, so 429s are real.
INFERENCE_MODEL = {
    "apiVersion": "flotilla.dev/v1alpha1",
    "kind": "InferenceModel",
    "metadata": {"name": MODEL, "namespace": NAMESPACE},
    "spec": {
        "model": {"name": MODEL, "source": {"builtin": "tiny"}},
        "resources": {"gpus": 0},
        "replicas": 0,
        "scaling": {"minReplicas": 0, "maxReplicas": 2, "targetQueueDepth": 1},
        "placement": {"policy": "cost-first"},
        "server": {"maxNumSeqs": 2, "maxBatchedTokens": 256, "prefillChunk": 128, "queueDepthPerSlot": 1,
                   "queueTimeoutSeconds": 2},
    },
}


class WithOperatorTarget:
    """The pod runner rewrites Prometheus' targets on every sync; this keeps the operator (and, once it runs,
    the gateway) among them."""

    def __init__(self, prometheus: RealPrometheus, operator_address: str) -> None:
        self.prometheus = prometheus
        self.fixed = [Target(operator_address, {"job_role": "operator"})]  # no namespace: keep the model's
        self.pods: list[Target] = []

    def set_targets(self, targets: Sequence[Target]) -> None:
        self.pods = list(targets)
        self.prometheus.set_targets([*self.pods, *self.fixed])

    def add(self, target: Target) -> None:
        self.fixed.append(target)
        self.set_targets(self.pods)


def walk_away_clients(endpoints, stop: threading.Event) -> None:
    """Clients that read one streamed chunk, then hang up: the server counts 499 client_gone."""
    body = {"model": MODEL, "prompt": "A client that leaves early", "max_tokens": 64, "stream": True,
            "ignore_eos": True}
    while not stop.is_set():
        for url in endpoints():
            with contextlib.suppress(httpx.HTTPError), httpx.Client(timeout=10) as client, \
                    client.stream("POST", f"{url}/v1/completions", json=body) as response:
                for _ in response.iter_lines():
                    break  # first line read: leave
        stop.wait(0.5)


@contextlib.contextmanager
def running_system(tmp_path: Path) -> Iterator[tuple[RealPrometheus, PodRunner, str]]:
    crd = yaml.safe_load((ROOT / "crds" / "flotilla.dev_inferencemodels.yaml").read_text())
    with contextlib.ExitStack() as stack:
        prometheus = stack.enter_context(RealPrometheus(scrape_interval_s=1.0))
        k8s = stack.enter_context(serve(tmp_path, crds=[crd]))
        operator = stack.enter_context(operator_process(
            k8s.kubeconfig, tmp_path, "--prometheus-url", prometheus.url, "--autoscale-interval-s", "1",
            "--drift-interval-s", "2", "--default-image", "flotilla-server:e2e"))
        targets = WithOperatorTarget(prometheus, f"127.0.0.1:{operator.metrics_port}")
        targets.set_targets([])
        runner = stack.enter_context(PodRunner(k8s.url, NAMESPACE, targets, tmp_path))  # type: ignore[arg-type]
        k8s.create(INFERENCE_MODEL)
        gateway = stack.enter_context(gateway_process(k8s.kubeconfig, tmp_path, "--namespace", NAMESPACE))
        targets.add(Target(f"127.0.0.1:{gateway.port}", {"job_role": "gateway"}))
        # the gateway's hold histogram must be scraped at 0 before the first release, or the hold panels' rate()
        # never sees it grow (a series' first sample has no increase before it)
        prometheus.wait_for(f'flotilla_gateway_hold_seconds_count{{model="{MODEL}"}}', timeout_s=SETTLE_S)
        yield prometheus, runner, gateway.url


@pytest.mark.timeout(READY_TIMEOUT_S + DATA_TIMEOUT_S + 120)
def test_every_dashboard_panel_returns_data_under_load(tmp_path: Path) -> None:
    with running_system(tmp_path) as (prometheus, runner, gateway_url):
        ready_by = time.monotonic() + READY_TIMEOUT_S
        # through the gateway from the start: the first requests are held, and wake the model from zero
        load = LoadGenerator(lambda: [gateway_url], MODEL, concurrency=12, max_tokens=16).start()
        while not runner.endpoints(MODEL):
            assert time.monotonic() < ready_by, f"no ready replica of {MODEL}: {runner.errors}\n{runner.describe()}"
            time.sleep(0.25)
        deadline = time.monotonic() + DATA_TIMEOUT_S  # the data budget starts when a replica serves, not before
        stop_walkers = threading.Event()
        walkers = threading.Thread(target=walk_away_clients, args=(lambda: runner.endpoints(MODEL), stop_walkers),
                                   daemon=True)
        walkers.start()
        try:
            failures = ["not evaluated yet"]
            while failures and time.monotonic() < deadline + WINDOW_S:
                time.sleep(2)
                failures = failing_queries(prometheus, [load_dashboards()[d] for d in DASHBOARDS], MUST_BE_NONZERO)
        finally:
            stop_walkers.set()
            report = load.stop()
            walkers.join(15)
        assert not failures, "dashboard queries without data:\n" + "\n".join(failures)
        assert report.completed > 0 and report.rejected_429 > 0, report
        assert not runner.errors, runner.errors
