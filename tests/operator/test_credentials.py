"""Credentials that rotate under the operator: the emulator refuses the old token, and both our client
and kopf log in again (credentials.py) and carry on."""

from __future__ import annotations

import asyncio
import functools

import pytest
from flotilla_operator import credentials
from flotilla_operator.kube import KubeClient, KubeError
from kubernetes.config import incluster_config

from tests.support.examples import EXAMPLES, crd, load_example
from tests.support.k8s_auth import TokenEmulator
from tests.support.k8s_emulator import serve
from tests.support.operator_process import operator_process

IM = ("flotilla.dev/v1alpha1", "inferencemodels")
WAIT_S = 30.0


def tiny(name: str) -> dict:
    obj = load_example(next(p for p in EXAMPLES if p.name == "tiny-cpu.yaml"))
    obj["metadata"]["name"] = name
    return obj


def test_the_client_logs_in_again_after_a_401_and_retries_once(tmp_path):
    with serve(tmp_path, emulator=TokenEmulator.for_file(tmp_path / "token")) as k8s:
        async def scenario() -> tuple[int, int]:
            kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
            try:
                await kube.get("v1", "namespaces", None, "default")
                k8s.emulator.rotate()
                assert await kube.get("v1", "namespaces", None, "default") is not None
                return kube.logins, k8s.emulator.unauthorized
            finally:
                await kube.close()
        logins, refused = asyncio.run(scenario())
    assert (logins, refused) == (2, 1)  # one 401, one new login, and the retry went through


def test_requests_refused_together_log_in_once(tmp_path):
    with serve(tmp_path, emulator=TokenEmulator.for_file(tmp_path / "token")) as k8s:
        async def scenario() -> int:
            kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
            try:
                k8s.emulator.rotate()
                found = await asyncio.gather(*(kube.get("v1", "namespaces", None, "default") for _ in range(5)))
                assert all(found)
                return kube.logins
            finally:
                await kube.close()
        assert asyncio.run(scenario()) == 2 and k8s.emulator.unauthorized == 5


def test_a_401_after_logging_in_again_is_reported_not_looped(tmp_path):
    with serve(tmp_path, emulator=TokenEmulator.for_file(tmp_path / "token")) as k8s:
        async def scenario() -> None:
            kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
            k8s.emulator.token = "nobody-has-this"
            try:
                await kube.get("v1", "namespaces", None, "default")
            finally:
                await kube.close()
        with pytest.raises(KubeError) as caught:
            asyncio.run(scenario())
    assert caught.value.status == 401 and k8s.emulator.unauthorized == 2


def test_no_credentials_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(credentials.NoCredentials, match="set KUBECONFIG"):
        credentials.login(str(tmp_path / "missing"))


def test_the_operator_keeps_working_when_its_token_rotates(tmp_path):
    emulator = TokenEmulator.for_file(tmp_path / "token")
    with serve(tmp_path, crds=[crd()], emulator=emulator) as k8s, \
            operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", "2") as op:
        k8s.create(tiny("before"))
        k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "before", "default"), WAIT_S, message="first Deployment")
        refused_before = emulator.unauthorized
        emulator.rotate()
        k8s.create(tiny("after"))
        k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "after", "default"), WAIT_S,
                       message=f"Deployment after the rotation; operator log:\n{op.log()[-3000:]}")
        k8s.eventually(lambda: ((k8s.get(*IM, "after", "default") or {}).get("status") or {}).get("phase"), WAIT_S,
                       message="status written after the rotation")
        assert "flotilla.dev/operator" in k8s.get(*IM, "after", "default")["metadata"].get("finalizers", [])  # kopf's own write
        assert emulator.unauthorized > refused_before, "the old token was never refused: the test proved nothing"
        assert op.process.poll() is None


def test_in_cluster_service_account_comes_first(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("pod-token")
    (tmp_path / "ca.crt").write_text("not checked until a TLS connection is made")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "ignored"))
    current = credentials.login()
    assert current.server == "https://10.0.0.1:443"
    assert current.authorization().lower() == "bearer pod-token"
    info = credentials.connection_info(current)
    assert (info.server, info.token, info.ca_path) == ("https://10.0.0.1:443", "pod-token", str(tmp_path / "ca.crt"))


def test_kopf_gets_the_same_login_as_our_client(tmp_path):
    with serve(tmp_path, emulator=TokenEmulator.for_file(tmp_path / "token")) as k8s:
        info = credentials.connection_info(credentials.login(k8s.kubeconfig))
        assert (info.server, info.scheme, info.token) == (k8s.url, "Bearer", k8s.emulator.token)
