"""The whole loop on one machine: API emulator, real operator, pod runner, real servers, real Prometheus.

    with whole_loop(tmp_path, autoscale_interval_s=2) as loop:
        loop.apply(inference_model(...))
        loop.wait(lambda: loop.replicas("m") == 3, 30, "three replicas")
        loop.restart_operator()           # SIGTERM, then a fresh process with the same flags

`wait` is for conditions, with deadlines that only a hang should reach (e2e/conftest.py, SETTLE_S): a test
times what it checks from the times events were recorded, not from when a wait returned.

Every process it starts (operator, Prometheus, one `flotilla-server` per replica) is stopped on exit,
by PID, whatever the test did. `Recorder` samples a model's replica counts in the background, so a
test can check that they moved monotonically.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import yaml

from e2e.pod_runner import PodRunner
from tests.support.k8s_emulator import EmulatorHandle, serve
from tests.support.operator_process import OperatorProcess, start_operator
from tests.support.prometheus import RealPrometheus

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
GROUP_VERSION, PLURAL = "flotilla.dev/v1alpha1", "inferencemodels"
POOLS = "modelpools"


def inference_model(name: str, policy: str = "cost-first", replicas: int = 1, max_num_seqs: int = 2,
                    **scaling: Any) -> dict[str, Any]:
    """A tiny-model InferenceModel with small engines, so one replica saturates on shared CPUs."""
    return {
        "apiVersion": GROUP_VERSION, "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": name, "source": {"builtin": "tiny"}},
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "replicas": replicas,
            "scaling": scaling,
            "placement": {"policy": policy},
            "server": {"maxNumSeqs": max_num_seqs, "maxBatchedTokens": 256, "prefillChunk": 128,
                       "queueDepthPerSlot": 8, "queueTimeoutSeconds": 20, "drainTimeoutSeconds": 5},
        },
    }


def model_pool(name: str, memory_budget_bytes: int, replicas: int = 0, max_num_seqs: int = 2,
               extra_args: tuple[str, ...] = (), **scaling: Any) -> dict[str, Any]:
    """A CPU ModelPool of small engines; `extra_args` reach each multi-model server (--kv-cache-memory, ...)."""
    return {
        "apiVersion": GROUP_VERSION, "kind": "ModelPool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "resources": {"gpus": 0, "cpu": "1", "memory": "1Gi"},
            "memoryBudget": str(memory_budget_bytes), "replicas": replicas, "scaling": scaling,
            "server": {"maxNumSeqs": max_num_seqs, "maxBatchedTokens": 256, "prefillChunk": 128,
                       "queueDepthPerSlot": 8, "queueTimeoutSeconds": 60, "drainTimeoutSeconds": 5,
                       "extraArgs": list(extra_args)},
        },
    }


@dataclass
class Loop:
    k8s: EmulatorHandle
    prometheus: RealPrometheus
    runner: PodRunner
    workdir: Path
    operator_args: tuple[str, ...]
    operator: OperatorProcess | None = None
    operator_starts: int = 0

    # --- the operator ----------------------------------------------------------------------------
    def start_operator(self) -> None:
        self.operator_starts += 1
        self.operator = start_operator(self.k8s.kubeconfig, self.workdir / f"operator-{self.operator_starts}.log",
                                       *self.operator_args, namespace=NAMESPACE)

    def restart_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        self.start_operator()

    def operator_log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.workdir.glob("operator-*.log")))

    # --- models ----------------------------------------------------------------------------------
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.k8s.create(obj)

    def delete(self, name: str, plural: str = PLURAL) -> None:
        with contextlib.suppress(Exception):
            self.k8s.delete(GROUP_VERSION, plural, name, NAMESPACE)

    def pool(self, name: str) -> dict[str, Any]:
        obj = self.k8s.get(GROUP_VERSION, POOLS, name, NAMESPACE)
        assert obj is not None, f"ModelPool {name} is gone"
        return obj

    def model(self, name: str) -> dict[str, Any]:
        obj = self.k8s.get(GROUP_VERSION, PLURAL, name, NAMESPACE)
        assert obj is not None, f"InferenceModel {name} is gone"
        return obj

    def replicas(self, name: str) -> int:
        return int(self.model(name)["spec"]["replicas"])

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for condition in (self.model(name).get("status") or {}).get("conditions") or []:
            if condition.get("type") == type_:
                return condition
        return {}

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        """The Events about `name` with `reason`, oldest first: the operator's record of when each happened."""
        found = [e for e in self.k8s.list("v1", "events", NAMESPACE)
                 if e.get("reason") == reason and e["involvedObject"]["name"] == name]
        return sorted(found, key=lambda e: epoch(e["firstTimestamp"]))

    def scales(self, name: str) -> list[tuple[float, int, int]]:
        """(time, from, to) of each scale the autoscaler made, from its Events ("3 -> 1: ..."), oldest first."""
        found = [(e, re.match(r"(\d+) -> (\d+):", e.get("message", ""))) for e in self.k8s.list("v1", "events", NAMESPACE)
                 if e["involvedObject"]["name"] == name]
        return sorted((epoch(e["firstTimestamp"]), int(m[1]), int(m[2])) for e, m in found if m)

    def wait(self, check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                last = check()
                if last:
                    return last
            time.sleep(interval_s)
        raise AssertionError(f"{what}: not within {timeout_s}s (last: {last!r}); runner errors: "
                             f"{self.runner.errors[-3:]}\n{self.runner.describe()}\n"
                             f"operator log tail:\n{self.operator_log()[-2500:]}")


@dataclass
class Sample:
    t_s: float  # time.monotonic()
    epoch_s: float  # time.time(), comparable with times in status
    replicas: int  # .spec.replicas
    ready: int
    phase: str | None
    recommendations: tuple[tuple[str, int], ...]  # status.autoscaler.recommendations as (time, replicas)
    decision: str = ""  # status.autoscaler.lastDecision


class Tick(NamedTuple):
    epoch_s: float  # the decision's time, as its recommendation in status says
    replicas: int  # .spec.replicas after it
    decision: str  # its lastDecision: the reason and the numbers (R=, Q=, ...)


@dataclass
class Recorder:
    """Samples one model every `interval_s` on its own thread and HTTP client."""

    api_url: str
    name: str
    interval_s: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Recorder:
        self._thread = threading.Thread(target=self._run, name=f"recorder-{self.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        with httpx.Client(base_url=self.api_url, timeout=5) as client:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    r = client.get(f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/{PLURAL}/{self.name}")
                    if r.status_code == 200:
                        obj = r.json()
                        status = obj.get("status") or {}
                        recommendations = tuple((r["time"], int(r["replicas"])) for r in
                                                (status.get("autoscaler") or {}).get("recommendations") or [])
                        self.samples.append(Sample(time.monotonic(), time.time(), int(obj["spec"]["replicas"]),
                                                   int(status.get("readyReplicas") or 0), status.get("phase"),
                                                   recommendations,
                                                   (status.get("autoscaler") or {}).get("lastDecision") or ""))
                self._stop.wait(self.interval_s)

    def between(self, start_s: float, end_s: float) -> list[int]:
        return [s.replicas for s in self.samples if start_s <= s.t_s <= end_s]

    def recommendations(self) -> list[tuple[float, int]]:
        """Every recommendation seen in status over the recording, as (epoch seconds, replicas)."""
        seen = {r for sample in self.samples for r in sample.recommendations}
        return sorted((epoch(t), n) for t, n in seen)

    def ticks(self, after_epoch_s: float) -> list[Tick]:
        """Each autoscaler decision after `after_epoch_s`, with the replicas it left (decisions on missing
        metrics record nothing and are absent).

        A decision's time is its recommendation's in status; the operator writes status after the scale
        PATCH, so the first sample holding that recommendation holds the replicas and lastDecision it made."""
        seen: dict[float, Tick] = {}
        for sample in self.samples:
            for t, _ in sample.recommendations:
                seen.setdefault(epoch(t), Tick(epoch(t), sample.replicas, sample.decision))
        return sorted(tick for tick in seen.values() if tick.epoch_s > after_epoch_s)

    def first(self, predicate: Callable[[Sample], bool], after_s: float = 0.0) -> Sample | None:
        return next((s for s in self.samples if s.t_s >= after_s and predicate(s)), None)


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def monotone(values: list[int], rising: bool) -> bool:
    pairs = itertools.pairwise(values)
    return all((b >= a) if rising else (b <= a) for a, b in pairs)


@contextlib.contextmanager
def whole_loop(workdir: Path, autoscale_interval_s: float = 2.0, drift_interval_s: float = 5.0) -> Iterator[Loop]:
    crds = [yaml.safe_load((ROOT / "crds" / f"flotilla.dev_{plural}.yaml").read_text()) for plural in (PLURAL, POOLS)]
    with contextlib.ExitStack() as stack:
        k8s = stack.enter_context(serve(workdir, crds=crds, namespaces=(NAMESPACE,)))
        prometheus = stack.enter_context(RealPrometheus(workdir=workdir / "prometheus"))
        runner = stack.enter_context(PodRunner(k8s.url, NAMESPACE, prometheus, workdir))
        loop = Loop(k8s, prometheus, runner, workdir, operator_args=(
            "--prometheus-url", prometheus.url, "--autoscale-interval-s", str(autoscale_interval_s),
            "--drift-interval-s", str(drift_interval_s),
        ))
        try:
            loop.start_operator()
            yield loop
        finally:
            if loop.operator is not None:
                loop.operator.stop()
