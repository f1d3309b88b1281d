"""A real Prometheus (Debian's `prometheus` binary) for tests: loopback only, temp dirs, 1 s scrapes.

Tests that check queries, dashboards or the autoscaler against Prometheus use this instead of a mock.

    with RealPrometheus() as prom:                 # started, ready, stopped on exit
        prom.set_targets([Target("127.0.0.1:8123", {"namespace": "ns", "model": "m", "pod": "p-0"})])
        prom.wait_for("sum(flotilla_slots)", lambda v: v >= 2)
        prom.stop(); prom.start()                   # same port, same data: an outage and a recovery

Targets are file-based service discovery (`targets.json`, rewritten atomically, re-read within a
second). `rule_files` loads alerting/recording rules. `query()` returns the instant vector as
`[(labels, value)]`; `samples()` a selector's raw samples and `query_range()` an expression over time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.ports import free_port

PROMETHEUS_BINARY = "prometheus"
START_TIMEOUT_S = 60.0  # a restart replays its data; on a busy machine that takes a while
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Target:
    address: str  # host:port serving /metrics
    labels: dict[str, str] = field(default_factory=dict)  # attached to every series scraped from it


class RealPrometheus:
    """One Prometheus process; `start()`/`stop()` may be repeated and keep the port and the data."""

    def __init__(self, scrape_interval_s: float = 1.0, rule_files: Sequence[Path] = (),
                 workdir: Path | None = None) -> None:
        if shutil.which(PROMETHEUS_BINARY) is None:
            raise RuntimeError("the `prometheus` binary is missing: run `make tools` (apt-get install prometheus)")
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="flotilla-prom-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_file = self.workdir / "targets.json"
        self.config_file = self.workdir / "prometheus.yml"
        self.log_file = self.workdir / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.set_targets([])
        interval = f"{int(scrape_interval_s * 1000)}ms"
        rules = "".join(f"\n  - {json.dumps(str(Path(p).resolve()))}" for p in rule_files)
        self.config_file.write_text(
            f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n"
            f"  evaluation_interval: {interval}\n"
            f"rule_files:{rules if rules else ' []'}\n"
            "scrape_configs:\n"
            "  - job_name: flotilla\n"
            "    file_sd_configs:\n"
            f"      - files: [{json.dumps(str(self.targets_file))}]\n"
            "        refresh_interval: 1s\n"
        )

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.running:
            return
        log = open(self.log_file, "ab")  # noqa: SIM115 - the child keeps writing after this returns
        self._process = subprocess.Popen(
            [PROMETHEUS_BINARY, f"--config.file={self.config_file}",
             f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=2h", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {START_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop, and remove the temp dir this object made."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> RealPrometheus:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- targets and queries ---------------------------------------------------------------------
    def set_targets(self, targets: Sequence[Target]) -> None:
        """Replace the scraped targets (atomic rename, so Prometheus never reads half a file). Safe from several
        threads (a pod runner's and the test's): each call writes its own temporary file, so one call's rename
        never takes the file another is about to rename (it once did: FileNotFoundError under load)."""
        groups = [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]
        fd, tmp = tempfile.mkstemp(dir=self.targets_file.parent, prefix="targets.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(groups))
        os.replace(tmp, self.targets_file)

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        data = self._data(promql)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def samples(self, selector: str, window_s: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """The raw samples of `selector` over the last `window_s` seconds, as [(labels, [(timestamp, value)])]."""
        result = self._data(f"{selector}[{int(window_s)}s]")["result"]
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in result]

    def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """`promql` evaluated every `step_s` from `start_s` to `end_s` (epoch seconds), as [(labels, [(time, value)])]."""
        data = self._data(promql, "query_range", start=start_s, end=end_s, step=step_s)
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def _data(self, promql: str, endpoint: str = "query", **params: float) -> dict:
        response = httpx.get(f"{self.url}/api/v1/{endpoint}", params={"query": promql, **params}, timeout=5.0)
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body.get('error', response.text)}")
        return body["data"]

    def wait_for(self, promql: str, predicate: Callable[[float], bool] = lambda _: True,
                 timeout_s: float = 30.0) -> float:
        """Poll until the query's first value satisfies `predicate`; return that value."""
        deadline = time.monotonic() + timeout_s
        last: object = "no data"
        while time.monotonic() < deadline:
            try:
                result = self.query(promql)
                if result:
                    last = result[0][1]
                    if predicate(result[0][1]):
                        return result[0][1]
            except (httpx.HTTPError, RuntimeError) as e:
                last = e
            time.sleep(0.25)
        raise TimeoutError(f"{promql!r} did not satisfy the condition in {timeout_s}s (last: {last})")
