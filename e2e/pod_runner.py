"""A stand-in kubelet: it runs every replica of every Deployment as a real `flotilla-server` process.

The operator only writes Deployments; something must turn `.spec.replicas` into running servers and
report back, or nothing closes the loop. For each Deployment in its namespace this runner:

- starts one process per missing replica from the pod template's command and args, on a free
  loopback port (`--host`/`--port` are rewritten), with the container's plain `env` values;
- polls `/readyz` and reports Pods and the Deployment's status (replicas, readyReplicas, ...)
  through the API, as the kubelet and the Deployment controller would;
- on scale-down, first takes the newest replicas (not-ready first) out of the endpoints and out of
  Prometheus' targets, then sends SIGTERM after `endpoint_delay_s` (the endpoints propagation a
  preStop sleep covers), and SIGKILL after the template's `terminationGracePeriodSeconds`;
- writes the file-SD targets, labelled `namespace`, `pod` and `model` (the pod's
  `flotilla.dev/model-name` annotation, else its `--served-model-name`; without either, the
  series keep the `model` label the server itself exports), and `pool` for a ModelPool's pods (from
  their `flotilla.dev/model-pool` label, as the pool's ServiceMonitor relabels it);
- fills ConfigMap volumes (a ModelPool's members file, an adapter list file) per replica and keeps them
  current, and stands a directory a test registers in `claims` for each PersistentVolumeClaim volume (pod_volumes);
- writes each Pod with its container's `http` port set to the replica's own port (each replica listens on its
  own loopback port where a real pod has its own IP), so the operator reaches its load report at podIP:port.

`endpoints(deployment)` is the Service: the ready replicas' base URLs, for the load generator. The
same replicas are published as EndpointSlices, as the EndpointSlice controller would, for flotilla-gateway:
one slice per replica (each listens on its own loopback port, and a slice's ports apply to all its
endpoints), labelled `kubernetes.io/service-name` with the Service's name (the Deployment's).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from flotilla_contract.labels import MODEL_POOL_LABEL

from e2e.pod_volumes import claim_mounts, config_map_mounts, refresh, rewrite_args
from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target

log = logging.getLogger("e2e.pod_runner")

SERVER_BINARY = "flotilla-server"
MODEL_NAME_ANNOTATION = "flotilla.dev/model-name"


def server_executable() -> str:
    """`flotilla-server` of the interpreter running the tests (the venv), else from PATH."""
    beside = Path(sys.executable).parent / SERVER_BINARY
    return str(beside) if beside.exists() else (shutil.which(SERVER_BINARY) or SERVER_BINARY)


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == flag and i + 1 < len(argv):
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return [*out, flag, value]


def _flag(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def pod_command(template: dict[str, Any], port: int) -> tuple[list[str], dict[str, str]]:
    """The argv and extra env that run the template's first container on 127.0.0.1:`port`."""
    container = template["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv or Path(argv[0]).name != SERVER_BINARY:
        argv = [SERVER_BINARY, *argv]  # the image's entrypoint is the server
    argv = [server_executable(), *argv[1:]]
    argv = _set_flag(_set_flag(argv, "--host", "127.0.0.1"), "--port", str(port))
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}
    return argv, env


def model_label(template: dict[str, Any], argv: list[str]) -> str:
    annotations = template.get("metadata", {}).get("annotations") or {}
    return annotations.get(MODEL_NAME_ANNOTATION) or _flag(argv, "--served-model-name") or ""


@dataclass
class Replica:
    deployment: str
    name: str
    port: int
    process: subprocess.Popen[bytes]
    template_hash: str
    model: str
    log_path: Path
    pool: str = ""  # the ModelPool whose pod this is
    mounts: dict[str, tuple[Path, str]] = field(default_factory=dict)  # ConfigMap volumes (pod_volumes)
    claims: dict[str, Path] = field(default_factory=dict)  # mount path -> directory of a PVC volume (pod_volumes)
    started_s: float = field(default_factory=time.monotonic)
    ready: bool = False
    ready_at_s: float | None = None  # time.monotonic() when /readyz first answered 200
    stop_at_s: float | None = None  # set: terminating (out of endpoints and targets)
    kill_at_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class PodRunner:
    """Run with `start()`/`close()` (or as a context manager); `close()` stops every process it started."""

    def __init__(self, api_url: str, namespace: str, prometheus: RealPrometheus, workdir: Path,
                 poll_interval_s: float = 0.25, endpoint_delay_s: float = 1.0) -> None:
        self.api = httpx.Client(base_url=api_url, timeout=5.0)
        self.namespace = namespace
        self.prometheus = prometheus
        self.workdir = workdir
        self.poll_interval_s = poll_interval_s
        self.endpoint_delay_s = endpoint_delay_s
        self._replicas: dict[str, list[Replica]] = {}  # deployment name -> live replicas
        self._terminating: list[Replica] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._names = itertools.count()
        self._reported: dict[str, Any] = {}
        self._deployments: dict[str, dict[str, Any]] = {}
        self._pod_calls: list[tuple[str, str, Any]] = []  # API writes for Pods, sent outside the lock
        self.starts: dict[str, int] = {}  # deployment -> processes started (for assertions)
        self.ready_epochs: dict[str, list[float]] = {}  # deployment -> time.time() each replica first served
        self.errors: list[str] = []
        self.last_sync_s = time.monotonic()
        self._slices: set[tuple[str, str]] = set()  # (deployment, replica) published as an EndpointSlice
        # PersistentVolumeClaim name -> the directory standing for its volume in every pod (a test fills it)
        self.claims: dict[str, Path] = {}

    # --- public ----------------------------------------------------------------------------------
    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            everyone = [r for rs in self._replicas.values() for r in rs] + self._terminating
            self._replicas.clear()
            self._terminating = []
        for replica in everyone:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for replica in everyone:
            try:
                replica.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()
        self.prometheus.set_targets([])
        self.api.close()

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def endpoints(self, deployment: str) -> list[str]:
        with self._lock:
            return [r.url for r in self._replicas.get(deployment, []) if r.ready and r.stop_at_s is None]

    def describe(self) -> str:
        """Every replica's state and the loop's heartbeat, for failure messages."""
        with self._lock:
            live = [r for rs in self._replicas.values() for r in rs] + self._terminating
        now = time.monotonic()
        lines = [f"pod runner: last sync {now - self.last_sync_s:.1f}s ago, {len(self.errors)} errors"]
        for r in live:
            state = "terminating" if r in self._terminating else ("ready" if r.ready else "starting")
            lines.append(f"  {r.name} pid={r.process.pid} exit={r.process.poll()} {state} age={now - r.started_s:.0f}s "
                         f"log: {self._tail(r, 2)[-300:]!r}")
        return "\n".join(lines)

    def processes(self, deployment: str) -> int:
        """Live server processes of `deployment`, terminating ones included."""
        with self._lock:
            live = self._replicas.get(deployment, []) + self._terminating
            return sum(1 for r in live if r.deployment == deployment and r.process.poll() is None)

    # --- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
                self.last_sync_s = time.monotonic()
            except Exception as error:  # the runner must outlive API hiccups; tests read .errors
                self.errors.append(repr(error))
                log.exception("pod runner sync failed")
            self._stop.wait(self.poll_interval_s)

    def _sync(self) -> None:
        listing = self.api.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments")
        listing.raise_for_status()
        deployments = {d["metadata"]["name"]: d for d in listing.json()["items"]}
        self._deployments = deployments
        with self._lock:
            for gone in set(self._replicas) - set(deployments):
                for replica in self._replicas.pop(gone):
                    self._begin_stop(replica, 2.0)
        for name, deployment in deployments.items():
            self._sync_deployment(name, deployment)
        self._flush_pod_calls()
        self._publish_endpoints()
        self._reap()
        with self._lock:
            live = [r for rs in self._replicas.values() for r in rs]
        config_maps: dict[str, dict[str, str] | None] = {}  # one read of each ConfigMap per sync
        for replica in live:
            refresh(self.api, self.namespace, replica.mounts, config_maps, replica.claims)
        targets = [Target(f"127.0.0.1:{r.port}", {"namespace": self.namespace, "pod": r.name}
                          | ({"model": r.model} if r.model else {}) | ({"pool": r.pool} if r.pool else {}))
                   for r in live]
        self.prometheus.set_targets(targets)

    def _sync_deployment(self, name: str, deployment: dict[str, Any]) -> None:
        template = deployment["spec"]["template"]
        template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        desired = int(deployment["spec"].get("replicas", 1))
        grace_s = float(template["spec"].get("terminationGracePeriodSeconds", 30))
        with self._lock:
            replicas = self._replicas.setdefault(name, [])
            for replica in list(replicas):
                if replica.process.poll() is not None:  # crashed: the kubelet would restart it
                    self.errors.append(f"{replica.name} exited with {replica.process.returncode}: {self._tail(replica)}")
                    replicas.remove(replica)
                elif replica.template_hash != template_hash:  # a new template replaces old pods
                    replicas.remove(replica)
                    self._begin_stop(replica, grace_s)
            surplus = len(replicas) - desired
            if surplus > 0:
                # as the ReplicaSet controller: not-ready first, then the newest
                victims = sorted(replicas, key=lambda r: (r.ready, -r.started_s))[:surplus]
                for replica in victims:
                    replicas.remove(replica)
                    self._begin_stop(replica, grace_s)
            missing = max(desired - len(replicas), 0)
        for _ in range(missing):
            replica = self._launch(name, template, template_hash)
            with self._lock:
                self._replicas[name].append(replica)
        for replica in list(self._replicas[name]):
            if not replica.ready:
                with contextlib.suppress(httpx.HTTPError):
                    replica.ready = httpx.get(f"{replica.url}/readyz", timeout=0.5).status_code == 200
                if replica.ready:
                    replica.ready_at_s = time.monotonic()
                    self.ready_epochs.setdefault(name, []).append(time.time())
                    self._pod_status(replica)
        self._flush_pod_calls()
        self._report(name, deployment)

    def _launch(self, deployment: str, template: dict[str, Any], template_hash: str) -> Replica:
        port = free_port()
        name = f"{deployment}-{template_hash[:5]}-{next(self._names)}"
        argv, env = pod_command(template, port)
        mounts = config_map_mounts(template, self.workdir / name)
        claims = claim_mounts(template, self.claims)
        refresh(self.api, self.namespace, mounts, {}, claims)
        argv = rewrite_args(argv, mounts, claims)
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env},
            )
        self.starts[deployment] = self.starts.get(deployment, 0) + 1
        log.info("started %s on port %d: %s", name, port, " ".join(argv))
        pool = (template.get("metadata", {}).get("labels") or {}).get(MODEL_POOL_LABEL, "")
        replica = Replica(deployment, name, port, process, template_hash, model_label(template, argv), log_path,
                          pool, mounts, claims)
        self._create_pod(replica, template)
        return replica

    def _begin_stop(self, replica: Replica, grace_s: float) -> None:
        """Out of endpoints and targets now; SIGTERM after the endpoint delay (callers hold the lock)."""
        self._pod_calls.append(("DELETE", self._pod_path(replica.name), None))
        now = time.monotonic()
        replica.stop_at_s = now + self.endpoint_delay_s
        replica.kill_at_s = replica.stop_at_s + grace_s
        self._terminating.append(replica)

    def _reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            for replica in list(self._terminating):
                if replica.process.poll() is not None:
                    self._terminating.remove(replica)
                elif replica.kill_at_s is not None and now >= replica.kill_at_s:
                    replica.process.kill()
                elif replica.stop_at_s is not None and now >= replica.stop_at_s:
                    replica.process.send_signal(signal.SIGTERM)
                    replica.stop_at_s = None  # signalled once

    def _report(self, name: str, deployment: dict[str, Any]) -> None:
        with self._lock:
            replicas = list(self._replicas.get(name, []))
        ready = sum(1 for r in replicas if r.ready)
        desired = int(deployment["spec"].get("replicas", 1))
        available = "True" if ready >= min(desired, 1) else "False"
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(replicas), "updatedReplicas": len(replicas), "readyReplicas": ready,
            "availableReplicas": ready, "unavailableReplicas": max(len(replicas) - ready, 0),
            "conditions": [
                {"type": "Available", "status": available, "reason": "MinimumReplicasAvailable"
                 if available == "True" else "MinimumReplicasUnavailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"
                 if ready == desired else "ReplicaSetUpdated"},
            ],
        }
        if self._reported.get(name) == status and deployment.get("status", {}).get("readyReplicas", 0) == ready:
            return
        response = self.api.patch(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}/status",
            content=json.dumps({"status": status}), headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code < 400:
            self._reported[name] = status

    # --- EndpointSlices --------------------------------------------------------------------------
    def _publish_endpoints(self) -> None:
        """One EndpointSlice per ready replica not terminating; a slice goes as its replica leaves."""
        with self._lock:
            wanted = {(r.deployment, r.name): r for rs in self._replicas.values() for r in rs
                      if r.ready and r.stop_at_s is None and r not in self._terminating}
        base = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        for deployment, name in sorted(set(wanted) - self._slices):
            replica = wanted[(deployment, name)]
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": self.namespace,
                                 "labels": {"kubernetes.io/service-name": deployment}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": replica.port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                                   "targetRef": {"kind": "Pod", "name": name, "namespace": self.namespace}}]}
            if self.api.post(base, json=body).status_code < 400:
                self._slices.add((deployment, name))
        for deployment, name in sorted(self._slices - set(wanted)):
            if self.api.delete(f"{base}/{name}").status_code in (200, 404):
                self._slices.discard((deployment, name))

    # --- Pod objects -----------------------------------------------------------------------------
    def _pod_path(self, name: str = "") -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" + (f"/{name}" if name else "")

    def _create_pod(self, replica: Replica, template: dict[str, Any]) -> None:
        deployment = self._deployments.get(replica.deployment, {})
        meta = deployment.get("metadata", {})
        owner = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": meta.get("name"), "uid": meta.get("uid"),
                  "controller": True}] if meta.get("uid") else []
        spec = copy.deepcopy(template.get("spec", {}))
        for declared in ((spec.get("containers") or [{}])[0].get("ports") or []):
            if declared.get("name") == "http":
                declared["containerPort"] = replica.port  # where this replica answers, as podIP:port
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": replica.name, "namespace": self.namespace,
                            "labels": dict(template.get("metadata", {}).get("labels") or {}),
                            "annotations": {"e2e.flotilla.dev/port": str(replica.port)}, "ownerReferences": owner},
               "spec": spec}
        self._pod_calls.append(("POST", self._pod_path(), pod))

    def _pod_status(self, replica: Replica) -> None:
        status = {"phase": "Running", "podIP": "127.0.0.1",
                  "conditions": [{"type": "Ready", "status": "True" if replica.ready else "False"}]}
        self._pod_calls.append(("STATUS", self._pod_path(replica.name) + "/status", {"status": status}))

    def _flush_pod_calls(self) -> None:
        calls, self._pod_calls = self._pod_calls, []
        for method, path, body in calls:
            if method == "STATUS":
                self.api.patch(path, content=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"})
            elif method == "POST":
                self.api.post(path, json=body)
            else:
                self.api.delete(path)

    @staticmethod
    def _tail(replica: Replica, lines: int = 15) -> str:
        try:
            return "\n".join(replica.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
