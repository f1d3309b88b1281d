"""The pod runner's translation of a pod template into a local command line (pure parts)."""

from __future__ import annotations

from e2e.pod_runner import model_label, pod_command, server_executable


def template(args: list[str], command: list[str] | None = None, annotations: dict | None = None) -> dict:
    container = {"name": "server", "args": args, "env": [{"name": "HOME", "value": "/tmp"},
                                                         {"name": "SECRET", "valueFrom": {"secretKeyRef": {}}}]}
    if command is not None:
        container["command"] = command
    return {"metadata": {"annotations": annotations or {}}, "spec": {"containers": [container]}}


def test_host_and_port_are_rewritten_to_loopback() -> None:
    argv, env = pod_command(template(["--model", "tiny", "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "2"]),
                            4321)
    assert argv[0] == server_executable()
    assert argv[1:] == ["--model", "tiny", "--max-num-seqs", "2", "--host", "127.0.0.1", "--port", "4321"]
    assert env == {"HOME": "/tmp"}  # only plain values; references need a kubelet


def test_equals_form_and_explicit_command() -> None:
    argv, _ = pod_command(template(["--port=8000", "--model=tiny"], command=["/usr/bin/flotilla-server"]), 99)
    assert argv[1:] == ["--model=tiny", "--host", "127.0.0.1", "--port", "99"]


def test_model_label_prefers_annotation_then_served_name() -> None:
    argv = ["x", "--served-model-name", "served", "--model", "tiny"]
    assert model_label(template([], annotations={"flotilla.dev/model-name": "a"}), argv) == "a"
    assert model_label(template([]), argv) == "served"
    assert model_label(template([]), ["x", "--model", "tiny"]) == ""  # the server's own label stands
