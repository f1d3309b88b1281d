"""The keys file is read again while the gateway runs: a new version takes effect, a refused one leaves the
last good keys in force (a typo neither lets a key in nor locks the others out) and is counted once in
flotilla_gateway_keys_reload_failures_total."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from flotilla_gateway.keys import Tenant
from flotilla_gateway.keys_file import KeysFile, Reload

from tests.gateway.conftest import Fleet
from tests.support.gateway_cluster import fake_pods, gateway_process, serve_api

GOOD = "sk-old: {tenant: team-a, models: [tiny]}\n"
TYPO = GOOD + "sk-new: {tenant: team-b, model: [tiny]}\n"  # `model`: refused, never every model
FIXED = "sk-new: {tenant: team-b, models: [tiny]}\n"  # and sk-old revoked


def write(path: Path, text: str) -> None:
    """Replace the file in one step, as the kubelet swaps a mounted Secret: a reader never sees half of it."""
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    os.replace(staged, path)


def test_a_new_version_loads_and_a_refused_one_keeps_the_last_good_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    write(path, GOOD)
    keys = KeysFile(path)
    good = {"sk-old": Tenant("team-a", frozenset({"tiny"}))}
    assert keys.keys == good and keys.reload() is Reload.UNCHANGED
    write(path, TYPO)
    assert keys.reload() is Reload.REFUSED and keys.keys == good
    assert "did you mean `models`?" in (keys.refusal or "")
    assert keys.reload() is Reload.UNCHANGED  # refused once per version, not once per read
    path.unlink()
    assert keys.reload() is Reload.REFUSED and keys.keys == good and "cannot read" in (keys.refusal or "")
    assert keys.reload() is Reload.UNCHANGED
    loaded_at_s = keys.loaded_at_s
    write(path, FIXED)
    assert keys.reload() is Reload.LOADED and keys.refusal is None and keys.loaded_at_s >= loaded_at_s
    assert keys.keys == {"sk-new": Tenant("team-b", frozenset({"tiny"}))}


def test_the_gateway_does_not_start_on_a_file_it_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(TYPO)
    with pytest.raises(ValueError, match="unknown field `model`"):
        KeysFile(tmp_path / "keys.yaml")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("keys")
    write(directory / "keys.yaml", GOOD)
    with serve_api(directory) as k8s, fake_pods() as pods, \
            gateway_process(k8s.kubeconfig, directory, "--api-keys-file", str(directory / "keys.yaml"),
                            "--api-keys-reload-interval-s", "0.05") as gateway:
        yield Fleet(k8s, pods, gateway, directory)


def metric(fleet: Fleet, name: str) -> float:
    lines = [line for line in httpx.get(fleet.gateway.url + "/metrics").text.splitlines()
             if line.startswith(name + " ")]
    assert len(lines) == 1, name
    return float(lines[0].split()[1])


def status(fleet: Fleet, key: str) -> int:
    return httpx.post(fleet.gateway.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2}).status_code


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 15  # hang-only: the gateway reads the file every 0.05 s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_running_gateway_keeps_serving_the_last_good_keys(fleet: Fleet) -> None:
    fleet.model("tiny", 1)
    wait_for(lambda: fleet.routed("tiny", 1), "tiny was never routed")
    failures = "flotilla_gateway_keys_reload_failures_total"
    loaded_at = "flotilla_gateway_keys_last_load_timestamp_seconds"
    assert status(fleet, "sk-old") == 200 and metric(fleet, failures) == 0
    started_at_s = metric(fleet, loaded_at)
    assert 0 < time.time() - started_at_s < 300

    write(fleet.directory / "keys.yaml", TYPO)
    wait_for(lambda: metric(fleet, failures) == 1, "the typo was never counted as a refused reload")
    assert status(fleet, "sk-old") == 200  # the last good keys stay in force
    assert status(fleet, "sk-new") == 401  # and the refused file's key is not admitted, with no model
    time.sleep(0.3)  # six more reads of the same refused file
    assert metric(fleet, failures) == 1 and metric(fleet, loaded_at) == started_at_s
    assert "did you mean `models`?" in fleet.gateway.log()

    write(fleet.directory / "keys.yaml", FIXED)
    wait_for(lambda: metric(fleet, loaded_at) > started_at_s, "the fixed file was never loaded")
    assert status(fleet, "sk-new") == 200 and status(fleet, "sk-old") == 401
    assert metric(fleet, failures) == 1
